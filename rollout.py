"""Collect rollouts to disk: load a model → generate at rollout precision, recording routes → score → write.

The disk half of the seed's SGLang → disk → Megatron pipeline (`collect_rollouts.py --output_dir --record_routing`):
  python rollout.py --preset toy --task sort --warmup-steps 80 --prompts-per-step 64 --group-size 8 \\
      --rollout-dtype bf16 --out runs/rollout_bf16
writes `runs/rollout_bf16/batch.safetensors` + `manifest.json` (`r3.rollout.batch.save_batch`: one atomic folder with a
checksum, no pickle), which `r3.rollout.batch.load_batch` (and `train.py`) read back, plus a `summary.json` of the
numbers it prints. The manifest records the model that sampled (`meta.model`, and `meta.model_digest`, a hash of its
weights that `train.py --rollouts` compares with the model it starts from). Every flag states its domain and is
refused outside it before any work, and so is an --out that cannot take a batch folder.

Routes are always recorded for an MoE model: top-k computes them anyway, so there is no flag to turn them off.
A dense model has none. After writing, it prints the reward, response length and, unless --no-mismatch, the
train/inference mismatch of this batch against the fp32 trainer forward, without and with R3 replay
(`r3.train.score.old_policy_pass`, the trainer's own measurement). Flags are shared with train.py
(`r3/train/config.py`): `--preset` names a toy preset, `--model PATH` a safetensors checkpoint
(`r3.runs.checkpoint.save_weights`).
"""
import os
import time

import torch

from r3.rollout.batch import check_batch_target, save_batch
from r3.runs.checkpoint import model_digest
from r3.train.collect import rollout
from r3.train.config import RolloutConfig, parse
from r3.errors import run_main
from r3.train.grpo import group_advantages
from r3.runs.io import atomic_write_json
from r3.train.score import FULL_VOCAB_MAX, old_policy_pass
from r3.tasks.tasks import make_task
from r3.train.warmup import load_model


def main(argv=None) -> dict:
    args = parse(RolloutConfig, argv, __doc__)
    check_batch_target(args.out)  # before the warm-up and the sampling
    torch.set_num_threads(args.threads)
    t0 = time.time()
    task = make_task(args.task)
    model, desc = load_model(args.preset, path=args.model, dense=args.dense, task=task, task_spec=args.task,
                             warmup_steps=args.warmup_steps, init_seed=args.model_seed, cache_dir=args.cache_dir,
                             arch=args.arch, progress=not args.no_progress, warmup_until=args.warmup_until)
    print(f"model: {desc}")
    t1 = time.time()
    batch, _ = rollout(model, task, num_prompts=args.prompts_per_step, group_size=args.group_size,
                       dtype=args.rollout_dtype, router_levels=args.router_levels, seed=args.seed,
                       temperature=args.temperature, top_p=args.top_p,
                       max_new_tokens=args.max_new_tokens,
                       keep_logp_V=not args.no_mismatch and model.cfg.vocab_size <= FULL_VOCAB_MAX)
    batch.meta.update(task=args.task, model=desc, model_digest=model_digest(model))  # train.py --rollouts checks it
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
        kw = dict(temperature=args.temperature, chunk=0 if model.cfg.vocab_size <= FULL_VOCAB_MAX else 1024)
        n_tokens = int(batch.loss_mask.sum())
        first = old_policy_pass(model, batch, replay="none", **kw)
        normal = summary["mismatch"] = dict(first.metrics, n_tokens=n_tokens)
        line = (f"mismatch vs fp32 trainer ({normal['n_tokens']} tokens) | kl {normal['kl']:.3e} | "
                f"kl_full {'-' if normal['kl_full'] is None else format(normal['kl_full'], '.3e')} | "
                f"extreme_frac {normal['extreme_frac']:.4f}")
        if batch.routes is not None:
            r3 = old_policy_pass(model, batch, replay="r3", own_routes=first.own_routes, **kw).metrics
            summary["mismatch_r3"] = r3 = dict(r3, n_tokens=n_tokens)
            line += (f" | router_flip_rate {normal['router_flip_rate']:.4f} | token_flip_rate "
                     f"{normal['token_flip_rate']:.4f} | R3 kl {r3['kl']:.3e} | R3 extreme_frac "
                     f"{r3['extreme_frac']:.4f}")
        print(line)
    atomic_write_json(os.path.join(args.out, "summary.json"), summary)
    print(f"total {time.time() - t0:.1f}s")
    return summary


if __name__ == "__main__":
    run_main(main)
