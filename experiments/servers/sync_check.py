"""What the post-sync weight check measures on the stand-in: for a zoo of toy models, each precision's gap between a
healthy engine and the trainer's reference, the noise the trainer predicts for that precision, and the gap of an
engine serving misread experts (vLLM 0.32's CPU reload bug, as `r3.serve --test-corrupt-reload` emulates it).

    python -m experiments.servers.sync_check    # ~2 min on 2 cores; writes results/servers/sync_check.{json,md}

The engine is `r3.serve`'s (`SGLangStandIn.input_logprobs`, our in-process engine at fp32 or bf16, fused kernels);
the reference, noise and verdict are `r3.rollout.sync_check`'s, as the client computes them after every sync. The
zoo spans what the check meets: random inits from flat (std 0.02) to chaotic (std 0.3, where a bf16 router flips on
almost every probe) on three presets, and the presets warmed up on two tasks as train.py starts them. Deterministic on
CPU (one thread, fixed seeds); vLLM's own numbers are in results/servers/vllm_cpu.json.
"""
import argparse
import dataclasses
import time

import torch

from experiments.common import fmt, markdown_table, write_results
from r3.errors import run_main
from r3.model.model import PRESETS, build_model
from r3.rollout.sync_check import TOLERANCE, probe, reference, verdict
from r3.tasks.tasks import make_task
from r3.tools.serve import SGLangStandIn, misread_experts
from r3.train.warmup import load_model

STDS, SEEDS, WARM = (0.02, 0.1, 0.3), (0, 1), (("toy", "cipher"), ("toy", "sort"), ("qwen3-ratio", "cipher"),
                                               ("qwen3-ratio", "sort"), ("toy-serve", "cipher"))


def zoo():
    """(name, a function building the fp32 model) for every model measured."""
    out = []
    for preset in ("toy", "toy-wide", "qwen3-ratio"):
        cfg = dataclasses.replace(PRESETS[preset], vocab_size=80)
        for std in STDS:
            for seed in SEEDS:
                out.append((f"{preset} random std {std} seed {seed}",
                            lambda cfg=cfg, seed=seed, std=std: build_model(cfg).init_weights(seed, std=std)))
    for preset, task in WARM:
        out.append((f"{preset} warmed up on {task} (80 steps)",
                    lambda p=preset, t=task: load_model(p, dense=False, task=make_task(t), task_spec=t,
                                                        warmup_steps=80, init_seed=0, progress=False)[0]))
    return out


def served(model, prec: str, seqs) -> torch.Tensor:
    st = SGLangStandIn(model.float().eval(), rollout_dtype=prec, seed=0, weights_root=None, desc="zoo")
    return torch.tensor([[x[0] for x in st.input_logprobs(s, 0)[1:]] for s in seqs], dtype=torch.float64)


def measure(name: str, build) -> dict:
    model, bad = build(), build()
    misread_experts(bad)
    seqs, row = probe(model.cfg), dict(model=name)
    for prec in ("fp32", "bf16"):
        ref, noise = reference(model.cfg, model.state_dict(), prec, seqs)
        ok, corrupt = (verdict("stand-in", prec, served(m, prec, seqs), ref, noise) for m in (model, bad))
        row[prec] = dict(noise=noise, gap=ok["gap"], max_gap=ok["max_gap"], tolerance=ok["tolerance"],
                         passes=ok["ok"], corrupt_gap=corrupt["gap"], corrupt_caught=corrupt["ok"] is False)
    return row


def render(rows: list[dict]) -> str:
    body = [[r["model"]] + [fmt(r[p][k]) for p in ("fp32", "bf16") for k in ("gap", "noise", "corrupt_gap")] +
            [("pass" if r[p]["passes"] else "FAIL") + " / " + ("caught" if r[p]["corrupt_caught"] else "MISSED")
             for p in ("fp32", "bf16")] for r in rows]
    floor = {p: f"{TOLERANCE[p][0]:g} + {TOLERANCE[p][1]:g} x noise" for p in ("fp32", "bf16")}
    return "\n".join([
        "# The post-sync weight check on the stand-in", "",
        f"Mean |engine - reference| over the probe's scored positions (`gap`), the trainer's predicted `noise` at the "
        f"precision, and the gap of an engine serving misread experts (`corrupt`). Tolerance: fp32 {floor['fp32']}, "
        f"bf16 {floor['bf16']} (r3/rollout/sync_check.py). Verdicts: the healthy engine / the corrupted one.", "",
        markdown_table(["model", "fp32 gap", "fp32 noise", "fp32 corrupt", "bf16 gap", "bf16 noise", "bf16 corrupt",
                        "fp32", "bf16"], body)])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/servers/sync_check.json", help="the results (and .md beside it)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    rows = [measure(name, build) for name, build in zoo()]
    for prec in ("fp32", "bf16"):
        healthy = [r[prec]["gap"] / max(r[prec]["noise"], 1e-12) for r in rows] if prec == "bf16" else []
        print(f"{prec}: {sum(r[prec]['passes'] for r in rows)}/{len(rows)} healthy pass, "
              f"{sum(r[prec]['corrupt_caught'] for r in rows)}/{len(rows)} corrupt caught"
              + (f"; healthy gap/noise {min(healthy):.2f}..{max(healthy):.2f}" if healthy else ""))
    write_results(args.out, dict(tolerance={k: list(v) for k, v in TOLERANCE.items()}, rows=rows), md=render(rows),
                  t0=t0)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_main(main)
