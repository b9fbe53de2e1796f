"""Collect rollouts to disk: load a model → generate at rollout precision, recording routes → score → write.

The disk half of the seed's SGLang → disk → Megatron pipeline (`collect_rollouts.py --output_dir --record_routing`):
  python rollout.py --model toy --task sort --warmup-steps 80 --num-prompts 64 --group-size 8 \\
      --rollout-dtype bf16 --out runs/rollout_bf16
writes `runs/rollout_bf16/batch.safetensors` + `manifest.json` (`r3.batch.save_batch`: one atomic folder with a
checksum, no pickle), which `r3.batch.load_batch` (and `train.py`) read back, plus a `summary.json` of the numbers
it prints. Every flag states its domain and is refused outside it before any work.

Routes are always recorded for an MoE model: top-k computes them anyway, so there is no flag to turn them off.
A dense model has none. After writing, it prints the reward, response length and, unless --no-mismatch, the
train/inference mismatch of this batch against the fp32 trainer forward, without and with R3 replay.
"""
import argparse
import os
import time

import torch

from r3.batch import save_batch
from r3.engine import ROLLOUT_DTYPES
from r3.grpo import group_advantages
from r3.io import atomic_write_json
from r3.model import PRESETS
from r3.score import FULL_VOCAB_MAX, mismatch_metrics
from r3.tasks import make_task, rollout
from r3.validate import nonneg_int, positive_float, positive_int, unit_interval
from r3.warmup import load_model


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="toy",
                   help=f"toy preset name ({', '.join(PRESETS)}) or path to a safetensors checkpoint written by "
                        "r3.warmup.save_weights")
    p.add_argument("--arch", default=None, choices=sorted(PRESETS),
                   help="architecture preset for a checkpoint whose metadata carries no model config")
    p.add_argument("--dense", action="store_true", help="use the preset's dense twin (no router, no routes)")
    p.add_argument("--task", default="sort", help="toy task: sort, reverse or add, optionally NAME:MIN-MAX")
    p.add_argument("--warmup-steps", type=nonneg_int, default=80,
                   help="supervised warm-up steps for a preset (cached under --cache-dir; the same default as "
                        "train.py, so `train.py --rollouts` starts from the model that sampled); 0 = random init")
    p.add_argument("--init-seed", type=int, default=0, help="seed of the preset's init and warm-up data")
    p.add_argument("--cache-dir", default=".cache/warmup", help="where warmed-up checkpoints are cached")
    p.add_argument("--num-prompts", type=positive_int, default=64, help="number of distinct prompts (>= 1)")
    p.add_argument("--group-size", type=positive_int, default=8, help="samples per prompt (one GRPO group; >= 1)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="response length cap, >= 1 (default: the task's)")
    p.add_argument("--rollout-dtype", default="bf16", choices=list(ROLLOUT_DTYPES),
                   help="rollout engine numerics (fp8 = simulated e4m3 weights, bf16 compute)")
    p.add_argument("--temperature", type=positive_float, default=1.0, help="sampling temperature (finite, > 0)")
    p.add_argument("--top-p", type=unit_interval, default=1.0, help="nucleus sampling threshold in (0, 1] (1 = off)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and of sampling")
    p.add_argument("--out", required=True, help="output folder (batch.safetensors + manifest.json)")
    p.add_argument("--no-mismatch", action="store_true", help="skip the fp32-trainer mismatch summary")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch CPU threads (toy matmuls are too small for more)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar during the warm-up")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    task = make_task(args.task)
    model, desc = load_model(args.model, dense=args.dense, task=task, task_spec=args.task,
                             warmup_steps=args.warmup_steps, init_seed=args.init_seed, cache_dir=args.cache_dir,
                             arch=args.arch, progress=not args.no_progress)
    print(f"model: {desc}")
    t1 = time.time()
    batch, _ = rollout(model, task, num_prompts=args.num_prompts, group_size=args.group_size,
                       dtype=args.rollout_dtype, seed=args.seed, temperature=args.temperature, top_p=args.top_p,
                       max_new_tokens=args.max_new_tokens,
                       keep_logits=not args.no_mismatch and model.cfg.vocab_size <= FULL_VOCAB_MAX)
    batch.meta.update(task=args.task, model=desc)
    gen_s = time.time() - t1
    save_batch(batch, args.out)

    resp_len = batch.response_mask.sum(1).float()
    group_std = group_advantages(batch.rewards, batch.group)[1]["reward/group_std"]  # the trainer's definition
    summary = dict(rows=len(batch), response_tokens=int(batch.response_mask.sum()),
                   reward_mean=float(batch.rewards.mean()), reward_group_std=group_std,
                   exact_frac=batch.meta["exact_frac"], response_len_mean=float(resp_len.mean()),
                   generate_s=round(gen_s, 2))
    print(f"wrote {args.out} | rows {len(batch)} | {args.rollout_dtype} | reward {summary['reward_mean']:.3f} "
          f"(group std {summary['reward_group_std']:.3f}) | exact {summary['exact_frac']:.3f} | "
          f"response len {summary['response_len_mean']:.2f} | generate {gen_s:.1f}s")
    if not args.no_mismatch:
        normal = mismatch_metrics(model, batch, replay=False)
        summary["mismatch"] = normal
        line = (f"mismatch vs fp32 trainer ({normal['n_tokens']} tokens) | kl {normal['kl']:.3e} | "
                f"kl_full {'-' if normal['kl_full'] is None else format(normal['kl_full'], '.3e')} | "
                f"extreme_frac {normal['extreme_frac']:.4f}")
        if batch.routes is not None:
            r3 = mismatch_metrics(model, batch, replay=True)  # flips: same normal forward, recomputed
            summary["mismatch_r3"] = r3
            line += (f" | router_flip_rate {normal['router_flip_rate']:.4f} | token_flip_rate "
                     f"{normal['token_flip_rate']:.4f} | R3 kl {r3['kl']:.3e} | R3 extreme_frac "
                     f"{r3['extreme_frac']:.4f}")
        print(line)
    atomic_write_json(os.path.join(args.out, "summary.json"), summary)
    print(f"total {time.time() - t0:.1f}s")
    return summary


if __name__ == "__main__":
    main()
