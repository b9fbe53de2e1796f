"""The headline result: no replay vs R3 over several seeds, arms differing only in --replay.

  python -m experiments.collapse                      # 5 seeds x {none, r3}, the calibrated toy setting
  python -m experiments.collapse --dose               # also: dose-response over rollout precision

Every arm is `train.py <COMMON> --replay ARM --seed S --rollout-dtype D`; COMMON is printed and saved, identical for
all arms. A run "collapses" at the first step the collapse guard reports reward_drop (reward EMA more than 0.3 below
its running peak) or a non-finite loss/gradient. Writes OUT/collapse.{md,json,png} (and OUT/dose.{md,json,png}).
Re-running resumes a partly finished sweep.
"""
import argparse
import os
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.common import write_results
from experiments.sweep import COMMON, RUNS_DIR, arm_run, run_all, summarize
from r3.guard import ema_series
from r3.io import read_jsonl

COLORS = {"none": "tab:red", "r3": "tab:blue", "r2": "tab:green"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds (each arm runs every one)")
    p.add_argument("--arms", nargs="+", default=["none", "r3"], choices=["none", "r2", "r3"],
                   help="the ablation set: replay modes to compare")
    p.add_argument("--steps", type=int, default=300, help="RL steps per run")
    p.add_argument("--rollout-dtype", default="fp8", help="rollout precision of the headline sweep")
    p.add_argument("--common", default=COMMON, help="train.py flags shared by every arm")
    p.add_argument("--mini-steps", type=int, default=4, help="optimizer steps per rollout batch, every arm")
    p.add_argument("--runs-dir", default=RUNS_DIR, help="where runs live (shared with ablations.py; reused)")
    p.add_argument("--dose", action="store_true", help="also sweep rollout precision fp32/fp16/bf16/fp8")
    p.add_argument("--dose-seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds for the dose sweep")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    p.add_argument("--out", default="results/collapse", help="output folder")
    return p.parse_args()


def fmt(x, spec=".3f"):
    """A table cell in a fixed format (the tables here compare runs column by column); '—' for None."""
    return "—" if x is None else format(x, spec)


def sweep(args, dtype, seeds):
    runs = {(arm, s): arm_run(replay=arm, seed=s, dtype=dtype, mini_steps=args.mini_steps, common=args.common,
                              runs_dir=args.runs_dir) for arm in args.arms for s in seeds}
    run_all(list(runs.values()), steps=args.steps, jobs=args.jobs, log_dir=os.path.join(args.runs_dir, "logs"))
    return {k: read_jsonl(os.path.join(out, "metrics.jsonl")) for k, (out, _) in runs.items()}


def headline(args, rows):
    summ = {k: summarize(v) for k, v in rows.items()}
    lines = ["| arm | seed | final reward | best reward (EMA) | held-out acc (sampled / greedy) | collapse step | "
             "max kl | max F(2) | max grad norm |", "|---|---|---|---|---|---|---|---|---|"]
    for (arm, s), m in summ.items():
        lines.append(f"| {arm} | {s} | {fmt(m['final_reward'])} | {fmt(m['best_reward_ema'])} | "
                     f"{fmt(m['heldout_accuracy'])} / {fmt(m['heldout_greedy'])} | "
                     f"{m['collapse_step'] if m['collapse_step'] is not None else '—'} | {fmt(m['max_kl'], '.2e')} | "
                     f"{fmt(m['max_extreme_frac'], '.2%')} | {fmt(m['max_grad_norm'], '.1f')} |")
    lines += ["", "| arm | collapsed | mean final reward | mean held-out acc | median max kl |",
              "|---|---|---|---|---|"]
    for arm in args.arms:
        ms = [m for (a, _), m in summ.items() if a == arm]
        kls = sorted(m["max_kl"] for m in ms)
        held = [m["heldout_accuracy"] for m in ms if m["heldout_accuracy"] is not None]
        lines.append(f"| {arm} | {sum(m['collapse_step'] is not None for m in ms)} of {len(ms)} | "
                     f"{fmt(sum(m['final_reward'] for m in ms) / len(ms))} | "
                     f"{fmt(sum(held) / len(held) if held else None)} | {fmt(kls[len(kls) // 2], '.2e')} |")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for (arm, s), r in rows.items():
        steps = [x["step"] for x in r]
        for ax, key in zip(axes, ("reward", "kl", "extreme_frac")):
            ys = [x[key] for x in r]
            if key == "reward":  # raw rewards are noisy: plot the EMA the collapse guard watches
                ys = ema_series(ys)
            ax.plot(steps, ys, color=COLORS[arm], alpha=0.7, lw=0.8, label=arm if s == args.seeds[0] else None)
    for ax, (key, log) in zip(axes, (("reward (EMA 0.9)", False), ("mismatch kl (k3)", True), ("F(2)", False))):
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.legend()
        if log:
            ax.set_yscale("log")
    fig.suptitle(f"{args.rollout_dtype} rollout, {len(args.seeds)} seeds; every arm: {args.common} "
                 f"--mini-steps {args.mini_steps} --steps {args.steps}", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "collapse.png"), dpi=110)
    return "\n".join(lines), {f"{a}-s{s}": m for (a, s), m in summ.items()}


def dose(args):
    table, data = [], {}
    for dtype in ("fp32", "fp16", "bf16", "fp8"):
        rows = sweep(args, dtype, args.dose_seeds)
        for arm in args.arms:
            ms = [summarize(r) for (a, _), r in rows.items() if a == arm]
            data[f"{dtype}-{arm}"] = dict(collapse_rate=sum(m["collapse_step"] is not None for m in ms) / len(ms),
                                          mean_kl=sum(m["mean_kl"] for m in ms) / len(ms),
                                          max_kl=max(m["max_kl"] for m in ms),
                                          final_reward=sum(m["final_reward"] for m in ms) / len(ms))
    table = ["| rollout | arm | collapse rate | mean kl | max kl | mean final reward |", "|---|---|---|---|---|---|"]
    for k, d in data.items():
        dtype, arm = k.split("-")
        table.append(f"| {dtype} | {arm} | {d['collapse_rate']:.0%} | {d['mean_kl']:.2e} | {d['max_kl']:.2e} | "
                     f"{d['final_reward']:.3f} |")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    dts = ["fp32", "fp16", "bf16", "fp8"]
    for arm in args.arms:
        for ax, key in zip(axes, ("mean_kl", "collapse_rate", "final_reward")):
            ax.plot(dts, [data[f"{d}-{arm}"][key] for d in dts], "o-", color=COLORS[arm], label=arm)
    axes[0].set_yscale("log")
    axes[0].set_title("mean mismatch kl over the run")
    axes[1].set_title(f"collapse rate ({len(args.dose_seeds)} seeds)")
    axes[1].set_ylim(-0.05, 1.05)
    axes[2].set_title("mean final reward (last 20 steps)")
    for ax in axes:
        ax.set_xlabel("rollout precision (mismatch dial)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "dose.png"), dpi=110)
    return "\n".join(table), data


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    print(f"every arm: train.py {args.common} --mini-steps {args.mini_steps} --steps {args.steps} "
          f"--rollout-dtype D --seed S --replay ARM")
    table, data = headline(args, sweep(args, args.rollout_dtype, args.seeds))
    print(table)
    write_results(os.path.join(args.out, "collapse.json"),
                  dict(common=args.common, steps=args.steps, rollout_dtype=args.rollout_dtype, runs=data), t0=t0,
                  md=f"common flags: `{args.common} --mini-steps {args.mini_steps} --steps {args.steps} "
                     f"--rollout-dtype {args.rollout_dtype}`; arms differ only in --replay\n\n{table}")
    if args.dose:
        table, data = dose(args)
        print(table)
        write_results(os.path.join(args.out, "dose.json"), data, t0=t0,
                      md=f"common flags: `{args.common} --mini-steps {args.mini_steps} --steps {args.steps}`; seeds "
                         f"{args.dose_seeds}\n\n{table}")
    print(f"wrote {args.out}/collapse.(md|json|png){' and dose.*' if args.dose else ''} in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
