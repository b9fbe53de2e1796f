"""Export a train.py run or a preset as an HF Qwen3-MoE folder (config.json + safetensors) that real engines serve.

    python -m r3.tools.export DIR --run RUN                          # a run's last checkpoint (RUN/ckpt.pt, or RUN/hf)
    python -m r3.tools.export DIR --preset toy-serve --task cipher   # what train.py --preset toy-serve starts from

A preset is built as train.py builds it (`r3.train.warmup.load_model`: widened to the task's vocabulary, the cached
warm-up of --warmup-steps from --seed), so a server started on DIR serves train.py's step-0 weights; a run is read
from its folder: the model config from RUN/run.json and the weights from RUN/ckpt.pt (loaded with
`weights_only=True`: tensors only, never arbitrary pickled objects), or RUN/hf for an FSDP run. Written atomically,
in --dtype (fp32 by default, as a CPU engine serves it).
Why a command of its own (not a train.py flag): exporting trains nothing and reads only what a run left or what its
first step would load, so it sits with the other commands on top (the stand-in server builds its model the same way);
a `--export-hf` on train.py would need a mode in which the loop does not run.
A head size real CPU engines cannot run gets a warning: vLLM 0.32's CPU attention takes head_dim in VLLM_CPU_HEAD_SIZES
only and fails at the first request otherwise (the toy presets' 16; `toy-serve` has 32).
Refused, one line each: both or neither of --run and --preset, a run folder without a checkpoint, a dense run or
preset (not a Qwen3MoeForCausalLM), a DIR that holds files (without --overwrite).
"""
import argparse
import dataclasses
import json
import os
import sys

import torch

from r3.errors import InputError, MissingInputError, run_main
from r3.model.model import PRESETS, ModelConfig, Transformer
from r3.runs.io import atomic_write
from r3.runs.runfolder import check_output_folder
from r3.scale.hf import load_pretrained, save_pretrained
from r3.tasks.tasks import make_task
from r3.train.config import INT_GE0, SamplingConfig, check_flags
from r3.train.warmup import load_model

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # v1/attention/backends/cpu_attn.py
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def from_run(run: str) -> tuple[Transformer, str]:
    """The model a run folder's last checkpoint holds: ckpt.pt (one process) or hf/ (FSDP, or --model)."""
    if not os.path.isdir(run):
        raise MissingInputError(f"--run {run}: no such run folder")
    ckpt, hf = os.path.join(run, "ckpt.pt"), os.path.join(run, "hf")
    if not os.path.isfile(ckpt):
        if os.path.isfile(os.path.join(hf, "config.json")):
            return load_pretrained(hf, dtype=torch.float32), f"{hf} (the run's HF checkpoint)"
        raise InputError(f"--run {run}: neither ckpt.pt nor hf/config.json; not a train.py run folder, or one that "
                         f"has not saved yet")
    try:
        with open(os.path.join(run, "run.json")) as f:
            cfg = ModelConfig(**json.load(f)["model"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"--run {run}: run.json does not name the model config ({e})") from e
    if cfg.dense:
        raise InputError(f"--run {run} trained the dense twin: not a Qwen3-MoE, nothing a MoE engine serves")
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    model = Transformer(cfg)
    try:
        model.load_state_dict(state["model"], strict=True)
    except (KeyError, TypeError, RuntimeError) as e:
        raise InputError(f"--run {run}: ckpt.pt does not hold this run's model ({str(e)[:300]})") from e
    return model, f"{ckpt} (step {state.get('step')})"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="example: python -m r3.tools.export /tmp/toy-hf --preset toy-serve")
    ap.add_argument("out", help="the HF folder to write (config.json + model.safetensors)")
    ap.add_argument("--run", help="a train.py run folder (--out of train.py)")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a toy preset, built and warmed up as train.py does")
    ap.add_argument("--task", default=SamplingConfig.task, help="--preset: the task whose vocabulary and warm-up "
                    f"(train.py's --task; default {SamplingConfig.task})")
    ap.add_argument("--warmup-steps", type=int, default=SamplingConfig.warmup_steps, help="--preset: train.py's")
    ap.add_argument("--seed", type=int, default=0, help="--preset: init and warm-up seed (train.py's --seed)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="weights' dtype on disk")
    ap.add_argument("--overwrite", action="store_true", help="replace DIR if it holds files")
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    check_flags(ap, args, dict(warmup_steps=INT_GE0, seed=INT_GE0))
    if (args.run is None) == (args.preset is None):
        sys.exit("error: give --run RUN or --preset NAME (one of them)")
    check_output_folder(args.out, "DIR")
    if os.path.isdir(args.out) and os.listdir(args.out) and not args.overwrite:
        sys.exit(f"error: {args.out} holds files; pass --overwrite to replace it")
    if args.run is not None:
        model, desc = from_run(args.run)
    else:
        try:
            task = make_task(args.task)
        except ValueError as e:
            raise InputError(f"--task {args.task}: {e}") from e
        model, desc = load_model(args.preset, dense=False, task=task, task_spec=args.task,
                                 warmup_steps=args.warmup_steps, init_seed=args.seed, progress=False)
    atomic_write(args.out, lambda tmp: save_pretrained(model, tmp, dtype=DTYPES[args.dtype]))
    cfg = model.cfg
    print(f"wrote {args.out}: {desc}; {cfg.num_hidden_layers} layers, {cfg.num_experts} experts top-"
          f"{cfg.num_experts_per_tok}, head_dim {cfg.head_dim}, vocab {cfg.vocab_size}, {args.dtype}")
    if cfg.head_dim not in VLLM_CPU_HEAD_SIZES:
        print(f"warning: head_dim {cfg.head_dim}: vLLM's CPU attention runs only {list(VLLM_CPU_HEAD_SIZES)} (it "
              f"starts, then fails at the first request); export --preset toy-serve for a CPU engine",
              file=sys.stderr)
    return dataclasses.asdict(cfg)


if __name__ == "__main__":
    run_main(main)
