"""Ablations in the style of the paper's Table 1 and Zheng et al. (2512.01374), on the shared toy setting.

  python -m experiments.collapse.ablations                       # 2 seeds, fp8-router rollout, the DEFAULT_ARMS

Arms (each pair that is compared differs in exactly one flag; everything else is experiments.sweep.COMMON, the
standard clipped update with the trainer's π_old, so that TIS / IcePop have a mismatch to correct):
  GRPO, GRPO+TIS, GRPO+IcePop, GRPO+R3, GRPO+TIS+R3, GSPO, GSPO+R3, GRPO+R2   at --mini-steps 4 (the default set)
  none / R2 / R3                                                             at --mini-steps 1 and 2 (--arms)
Published orderings to compare with: GRPO+R3 > GRPO+TIS > GRPO; R2 beats R3 at 2 mini-steps, R3 beats R2 at >= 4.
Writes OUT/ablations.{md,json,png}. Runs are shared with experiments/collapse/protocol.py (same folder, same flags).
"""
import argparse
import os
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.common import fmt, write_results
from experiments.sweep import COMMON, RUNS_DIR, arm_run, run_all, summarize
from r3.errors import run_main
from r3.runs.ema import ema_series
from r3.runs.io import read_jsonl

ARMS = {  # label: (replay, loss, is_correction, mini_steps)
    "GRPO": ("none", "grpo", "none", 4),
    "GRPO+TIS": ("none", "grpo", "tis", 4),
    "GRPO+IcePop": ("none", "grpo", "icepop", 4),
    "GRPO+R3": ("r3", "grpo", "none", 4),
    "GRPO+TIS+R3": ("r3", "grpo", "tis", 4),
    "GSPO": ("none", "gspo", "none", 4),
    "GSPO+R3": ("r3", "gspo", "none", 4),
    "GRPO+R2": ("r2", "grpo", "none", 4),
    "GRPO (1 mini-step)": ("none", "grpo", "none", 1),
    "GRPO+R2 (1 mini-step)": ("r2", "grpo", "none", 1),
    "GRPO+R3 (1 mini-step)": ("r3", "grpo", "none", 1),
    "GRPO (2 mini-steps)": ("none", "grpo", "none", 2),
    "GRPO+R2 (2 mini-steps)": ("r2", "grpo", "none", 2),
    "GRPO+R3 (2 mini-steps)": ("r3", "grpo", "none", 2),
}

DEFAULT_ARMS = [a for a in ARMS if "mini-step" not in a]


def mean_of(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds for every arm")
    p.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS), metavar="ARM",
                   help=f"subset of: {', '.join(ARMS)}")
    p.add_argument("--steps", type=int, default=300, help="RL steps per run")
    p.add_argument("--rollout-dtype", default="fp8-router", help="rollout precision for every arm")
    p.add_argument("--common", default=COMMON, help="train.py flags shared by every arm")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    p.add_argument("--runs-dir", default=RUNS_DIR, help="where runs live (shared with collapse.py; reused)")
    p.add_argument("--out", default="results/ablations", help="output folder")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    runs = {}
    for label in args.arms:
        replay, loss, is_c, mini = ARMS[label]
        for s in args.seeds:
            runs[label, s] = arm_run(replay=replay, seed=s, dtype=args.rollout_dtype, loss=loss, is_correction=is_c,
                                     mini_steps=mini, common=args.common, runs_dir=args.runs_dir)
    run_all(list(runs.values()), steps=args.steps, jobs=args.jobs, log_dir=os.path.join(args.runs_dir, "logs"))
    rows = {k: read_jsonl(os.path.join(out, "metrics.jsonl")) for k, (out, _) in runs.items()}

    lines = ["| arm | held-out acc (final) | per seed | mean reward over the run | final reward | collapsed | "
             "mean kl | max kl | max grad norm |", "|---|---|---|---|---|---|---|---|---|"]
    data = {}
    for label in args.arms:
        ms = [summarize(rows[label, s]) for s in args.seeds]
        held = [m["heldout_accuracy"] for m in ms]
        d = data[label] = dict(
            final_reward=sum(m["final_reward"] for m in ms) / len(ms), per_seed_reward=[m["final_reward"] for m in ms],
            run_mean_reward=mean_of([sum(r["reward"] for r in rows[label, s]) / len(rows[label, s])
                                     for s in args.seeds]),
            best_reward_ema=sum(m["best_reward_ema"] for m in ms) / len(ms),
            collapsed=sum(m["collapse_step"] is not None for m in ms), mean_kl=sum(m["mean_kl"] for m in ms) / len(ms),
            max_kl=max(m["max_kl"] for m in ms), max_grad_norm=max(m["max_grad_norm"] for m in ms),
            heldout_accuracy=mean_of(held), per_seed_heldout=held)
        lines.append(f"| {label} | {fmt(d['heldout_accuracy'], spec='.3f')} | "
                     f"{' / '.join(fmt(x, spec='.3f') for x in held)} | "
                     f"{d['run_mean_reward']:.3f} | {d['final_reward']:.3f} | {d['collapsed']} of {len(ms)} | "
                     f"{d['mean_kl']:.2e} | {d['max_kl']:.2e} | {d['max_grad_norm']:.1f} |")
    table = "\n".join(lines)
    print(table)
    write_results(os.path.join(args.out, "ablations.json"),
                  dict(common=args.common, steps=args.steps, seeds=args.seeds, arms=data), t0=t0,
                  md=f"every arm: `{args.common} --steps {args.steps} --rollout-dtype {args.rollout_dtype}` plus its "
                     f"own flags; seeds {args.seeds}; final reward = mean of the last 20 steps; held-out acc = "
                     f"eval/accuracy (sampled) at the last step\n\n{table}")

    fig, axes = plt.subplots(1, 3, figsize=(18, 4.8), gridspec_kw=dict(width_ratios=[1.4, 1, 1]))
    for i, label in enumerate(args.arms):
        for s in args.seeds:
            r = rows[label, s]
            axes[0].plot([x["step"] for x in r], ema_series([x["reward"] for x in r]), color=plt.cm.tab20(i % 20), lw=1,
                         alpha=0.8,
                         label=label if s == args.seeds[0] else None)
    ys = range(len(args.arms))[::-1]
    for y, label in zip(ys, args.arms):  # bars: mean over seeds; dots: each seed
        d = data[label]
        seeds = [x for x in d["per_seed_heldout"] if x is not None]
        axes[1].barh(y, d["heldout_accuracy"] or 0.0, color="lightgray")
        axes[1].plot(seeds, [y] * len(seeds), "o", color="k", ms=3)
        axes[2].barh(y, d["mean_kl"], color="lightsteelblue")
    for ax in axes[1:]:
        ax.set_yticks(list(ys), args.arms, fontsize=8)
    axes[1].set_xlim(0, 1.0)
    axes[0].set_title("reward (EMA 0.9)")
    axes[0].set_xlabel("step")
    axes[0].legend(fontsize=7)
    axes[1].set_title("final held-out accuracy, sampled (bar: mean, dots: seeds)")
    axes[2].set_title("mean mismatch kl over the run")
    axes[2].set_xscale("log")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "ablations.png"), dpi=110)
    print(f"wrote {args.out}/ablations.(md|json|png) in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    run_main(main)
