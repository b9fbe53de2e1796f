"""The pre-registered collapse protocol: no replay vs R3 vs an fp32-rollout oracle, same seeds, one flag apart.

  python -m experiments.collapse                       # the default setting (DEFAULT_SETTING), seeds 0-4
  python -m experiments.collapse --setting headline --phase   # the original protocol, and lr x rollout precision
Settings (--setting): `headline`, the protocol's own (experiments.sweep's HEADLINE update, rollout precision D, 400
steps), or one of the regime study's (`lv3`, `lv3-clip`: experiments/regime/design.py's flags, the engine's router on
a 3-point grid, 4 mini-steps, 800 steps; the runs are exactly the regime grid's and round 5's for the same seed).
The default is the setting round 5 confirmed by its pre-registered rule (results/regime/confirm/confirm.json; the
test suite checks the two agree), `headline` while none is confirmed.
Arms (ARMS), everything else identical (`--common`, printed and saved):
  none    --replay none --rollout-dtype D      the engine samples at precision D, the trainer routes by itself
  r3      --replay r3   --rollout-dtype D      the same engine; the update replays the engine's routes
  oracle  --replay none --rollout-dtype fp32   no precision mismatch: the control that shows a collapse of `none`
                                               is the mismatch's doing and not plain RL instability (at a regime
                                               setting: the fp32 engine without the dial, the regime's `oracle`)
The collapse rule was fixed before any run and is printed with every result. `headline`: DIP_RULE
(experiments/rules.py): a run collapses at the first step where its reward EMA (decay 0.9) is >= 0.3 below its
running peak (the peak taken after the first 5 steps), or its held-out accuracy (eval/accuracy, sampled) is >= 0.3
below its best so far, or its loss or grad norm is not finite. The regime settings: the sustained rule (RULE), the one
the regime study and round 5 decide by. It is computed from metrics.jsonl, the same for every arm.
Writes OUT/collapse.{md,json,png}, OUT/fidelity.png (runs keyed ARM-sSEED, each with collapse_step: null when
stable) and, with --phase, OUT/phase.{md,json,png}. Runs live in --runs-dir (default OUT/runs); re-running resumes
a partial sweep (finished runs are skipped, partial ones continue bit-identically), so longer horizons or more seeds
extend it.
"""
import argparse
import os
import re
import statistics
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.common import fmt, write_results
from experiments.rules import DIP_RULE, DIP_RULE_TEXT, RULE, RULE_TEXT, collapse_step, sustained_collapse
from experiments.sweep import HEADLINE, run_all, set_flag, summarize, with_lr
from r3.runs.ema import ema_series
from r3.runs.io import read_jsonl

ARMS = {"none": ("none", None), "r3": ("r3", None), "oracle": ("none", "fp32")}  # arm: (replay, dtype override)
COLORS = {"none": "tab:red", "r3": "tab:blue", "oracle": "tab:gray"}
PHASE_LRS = (3e-4, 1e-3)
PHASE_DTYPES = ("fp8-router", "int4")
SETTINGS = ("headline", "lv3-clip", "lv3")  # the protocol's own, and round 5's two regime settings
DEFAULT_SETTING = "lv3-clip"  # round 5 confirmed both settings; lv3-clip separated most (Holm p 0.0078 vs 0.023)
# The regime settings, as experiments/regime/design.py fixes them (a study imports no other study's module:
# tests/test_experiments.py checks that these flags are the regime grid's, run for run).
REGIME_STEPS = 800  # the regime grid's and round 5's steps (experiments/regime/confirm.py STEPS)
REGIME_COMMON = HEADLINE.replace("--warmup-steps 80", "--warmup-steps 400 --warmup-until 0.3") + " --eval-trainer"
REGIME_ENGINE = ("--rollout-dtype", "fp8-router", "--router-levels", "3")  # lv3: the router on a 3-point grid
ORACLE_ENGINE = ("--rollout-dtype", "fp32")  # the regime's oracle: fp32, no dial
CLIP = ("--clip-low", "0.2", "--clip-high", "0.28", "--grad-clip", "1.0", "--old-logp", "trainer")  # `-clip`
RULES = {"headline": (collapse_step, DIP_RULE, DIP_RULE_TEXT), "regime": (sustained_collapse, RULE, RULE_TEXT)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=SETTINGS, default=DEFAULT_SETTING,
                   help=f"headline (the protocol's own) or a regime setting (default: {DEFAULT_SETTING})")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds (each arm runs every one)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="arms to run")
    p.add_argument("--steps", type=int, default=None,
                   help=f"RL steps per run (default: 400 at headline, {REGIME_STEPS} at a regime setting)")
    p.add_argument("--rollout-dtype", default=None,
                   help="rollout precision D of the none and r3 arms (headline only; default fp8-router)")
    p.add_argument("--common", default=None, help="train.py flags shared by every arm (default: HEADLINE at headline, "
                                                  "REGIME_COMMON, the regime design's, at a regime setting)")
    p.add_argument("--runs-dir", default=None, help="where runs live (default OUT/runs; reused, resumed)")
    p.add_argument("--phase", action="store_true", help="also the phase diagram over --phase-lrs x --phase-dtypes")
    p.add_argument("--phase-lrs", type=float, nargs="+", default=list(PHASE_LRS), help="phase: learning rates")
    p.add_argument("--phase-dtypes", nargs="+", default=list(PHASE_DTYPES), help="phase: rollout precisions")
    p.add_argument("--phase-seeds", type=int, nargs="+", default=[0], help="phase: seeds per cell")
    p.add_argument("--phase-steps", type=int, default=200, help="phase: RL steps per run")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    p.add_argument("--out", default=None, help="output folder (default results/collapse at headline, "
                                               "results/collapse/SETTING at a regime setting)")
    args = p.parse_args(argv)
    regime = args.setting != "headline"
    if regime and args.rollout_dtype is not None:
        p.error(f"--rollout-dtype belongs to --setting headline; {args.setting} fixes its engine (fp8-router, "
                f"--router-levels 3)")
    if regime and args.phase:
        p.error(f"--phase varies the headline setting's lr and precision: pass --setting headline "
                f"(not {args.setting})")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    args.rule = "regime" if regime else "headline"
    args.rollout_dtype = args.rollout_dtype or "fp8-router"
    args.common = args.common or (REGIME_COMMON if regime else HEADLINE)
    args.steps = args.steps or (REGIME_STEPS if regime else 400)
    args.out = args.out or os.path.join("results", "collapse", *([args.setting] if regime else []))
    args.runs_dir = args.runs_dir or os.path.join(args.out, "runs")
    return args


def setting_flags(setting: str, oracle: bool = False) -> list[str]:
    """The flags a regime setting sets over the common ones: its engine (the oracle's: fp32, no dial), then the
    clipped update for `-clip`."""
    return [*(ORACLE_ENGINE if oracle else REGIME_ENGINE), *(CLIP if setting.endswith("-clip") else ())]


def regime_run(setting: str, arm: str, seed: int, common: str, runs_dir: str) -> tuple[str, list[str]]:
    """(run folder, flags) of one arm at a regime setting, named and built as the regime grid names and builds its
    cells (none and r3 at the setting, the oracle at `oracle` with the setting's variant), 4 mini-steps: with
    REGIME_COMMON, the very run of the grid and round 5 for that seed."""
    flags, extra = common.split(), setting_flags(setting, oracle=arm == "oracle")
    for i in range(0, len(extra), 2):
        flags = set_flag(flags, extra[i], extra[i + 1])
    variant = setting.partition("-")[2]
    name = f"oracle{'-' + variant if variant else ''}-none" if arm == "oracle" else f"{setting}-{arm}"
    return os.path.join(runs_dir, f"{name}-n4-s{seed}"), \
        flags + ["--replay", ARMS[arm][0], "--mini-steps", "4", "--seed", str(seed)]


def own_lr(common: str, lr: float | None) -> float | None:
    """None when `lr` is the common flags' own --lr (that cell reuses the headline runs), else lr."""
    m = re.search(r"--lr\s+(\S+)", common)
    return None if lr is None or (m and float(m[1]) == lr) else lr


def arm_flags(arm: str, seed: int, dtype: str, common: str) -> list[str]:
    """train.py flags of one arm: the shared flags, then only --replay and --rollout-dtype differ between arms."""
    replay, override = ARMS[arm]
    return [*common.split(), "--replay", replay, "--rollout-dtype", override or dtype, "--seed", str(seed)]


def sweep(args, cells: list[tuple[str, int, str, float | None]], steps: int, runs_dir: str) -> dict:
    """cells: (arm, seed, dtype, lr or None). Runs them (oracle runs shared across dtypes); returns their rows."""
    runs = {}
    for arm, seed, dtype, cell_lr in cells:
        d, lr = ARMS[arm][1] or dtype, own_lr(args.common, cell_lr)
        name = f"{arm}-{d}{'' if lr is None else f'-lr{lr:g}'}-s{seed}"
        flags = arm_flags(arm, seed, dtype, with_lr(args.common, lr))
        runs[arm, seed, dtype, cell_lr] = (os.path.join(runs_dir, name), flags)
    unique = list({out: (out, flags) for out, flags in runs.values()}.values())
    run_all(unique, steps=steps, jobs=args.jobs, log_dir=os.path.join(runs_dir, "logs"))
    return {k: read_jsonl(os.path.join(out, "metrics.jsonl")) for k, (out, _) in runs.items()}


def fidelity_points(rows: list[dict]) -> list[dict]:
    """Steps with a fidelity measurement that has a direction. Where either gradient was zero (every group's rewards
    tied, as on a solved task), r3.train.fidelity now logs None; logs written before that hold cos 0 and a rel err of
    |g| / 1e-30 there, and are skipped by the same rule."""
    return [r for r in rows if r.get("fidelity/cos") is not None and r.get("fidelity/rel_err") is not None
            and r.get("fidelity/grad_norm", 1.0) > 0 and r["fidelity/rel_err"] < 1e10]


def run_summary(rows: list[dict], rule: str = "headline") -> dict:
    """summarize() plus the collapse step by the setting's rule (RULES) and the fidelity and held-out precursors."""
    m = summarize(rows)
    m["collapse_step"], m["collapse_reason"] = RULES[rule][0](rows)
    fid = fidelity_points(rows)
    mean = lambda k: (lambda v: sum(v) / len(v) if v else None)([r[k] for r in fid if r[k] is not None])  # noqa
    m.update(mean_fidelity_cos=mean("fidelity/cos"), mean_fidelity_rel_err=mean("fidelity/rel_err"),
             mean_fidelity_cos_resample=mean("fidelity/cos_resample"), mean_same_rows=mean("fidelity/same_rows"),
             mean_extreme_frac=(lambda v: sum(v) / len(v) if v else None)(
                 [r["extreme_frac"] for r in rows if r.get("extreme_frac") is not None]),
             min_entropy=min((r["entropy"] for r in rows if r.get("entropy") is not None), default=None))
    return m


def cell(x, spec=".3f"):
    """A table cell in a fixed format (these tables compare runs column by column)."""
    return fmt(x, spec=spec)


def headline_table(summ: dict, arms: list[str]) -> str:
    lines = ["| arm | seed | collapse step (why) | final reward | best reward EMA | held-out acc best / final | "
             "mean kl | max kl | max F(2) | max grad norm | fidelity cos | fidelity rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (arm, s), m in summ.items():
        why = "—" if m["collapse_step"] is None else f"{m['collapse_step']} ({m['collapse_reason']})"
        lines.append(f"| {arm} | {s} | {why} | {cell(m['final_reward'])} | {cell(m['best_reward_ema'])} | "
                     f"{cell(m['best_heldout_accuracy'])} / {cell(m['heldout_accuracy'])} | "
                     f"{cell(m['mean_kl'], '.2e')} | "
                     f"{cell(m['max_kl'], '.2e')} | {cell(m['max_extreme_frac'], '.2%')} | "
                     f"{cell(m['max_grad_norm'], '.3g')} | {cell(m['mean_fidelity_cos'])} | "
                     f"{cell(m['mean_fidelity_rel_err'])} |")
    lines += ["", "| arm | collapsed | mean final reward | mean best held-out acc | mean kl | median max grad norm | "
              "mean fidelity cos | mean fidelity rel err | resample cos (noise floor) |", "|---" * 9 + "|"]
    for arm in arms:
        ms = [m for (a, _), m in summ.items() if a == arm]
        if not ms:
            continue
        avg = lambda k: (lambda v: sum(v) / len(v) if v else None)([m[k] for m in ms if m[k] is not None])  # noqa
        gns = sorted(m["max_grad_norm"] for m in ms if m["max_grad_norm"] is not None)
        lines.append(f"| {arm} | {sum(m['collapse_step'] is not None for m in ms)} of {len(ms)} | "
                     f"{cell(avg('final_reward'))} | {cell(avg('best_heldout_accuracy'))} | "
                     f"{cell(avg('mean_kl'), '.2e')} | "
                     f"{cell(statistics.median(gns) if gns else None, '.3g')} | {cell(avg('mean_fidelity_cos'))} | "
                     f"{cell(avg('mean_fidelity_rel_err'))} | {cell(avg('mean_fidelity_cos_resample'))} |")
    return "\n".join(lines)


def paired_table(summ: dict, arms: list[str]) -> str:
    """Seed by seed (the arms of a seed share its warm-up, prompts and sampling seed): final held-out accuracy, and
    the step of a collapse if any."""
    seeds = sorted({s for _, s in summ})
    lines = ["| seed | " + " | ".join(f"{a}: held-out acc final (best)" for a in arms) + " |", "|---" * (len(arms) + 1)
             + "|"]
    for s in seeds:
        cells = []
        for a in arms:
            m = summ.get((a, s))
            c = "—" if m is None else \
                f"{cell(m['heldout_accuracy'], '.2f')} ({cell(m['best_heldout_accuracy'], '.2f')})"
            cells.append(c if m is None or m["collapse_step"] is None else c + f", collapsed @ {m['collapse_step']}")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PANELS = (("reward", "reward (EMA 0.9)", False), ("eval/accuracy", "held-out accuracy (sampled)", False),
          ("kl", "mismatch kl (k3)", True), ("extreme_frac", "F(2)", False),
          ("grad_norm", "pre-clip grad norm", True), ("fidelity/cos", "fidelity: cos(g_arm, g_on-policy)", False))


def plot_runs(rows: dict, title: str, path: str) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    seen = set()
    for (arm, s), r in rows.items():
        for ax, (key, _, _) in zip(axes.flat, PANELS):
            src = fidelity_points(r) if key.startswith("fidelity/") else r
            pts = [(x["step"], x[key]) for x in src if x.get(key) is not None and x[key] == x[key]]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ys = ema_series(ys) if key == "reward" else ys
            ax.plot(xs, ys, color=COLORS[arm], alpha=0.7, lw=0.9, marker="." if len(xs) < 40 else None,
                    label=arm if arm not in seen else None)
        seen.add(arm)
    for ax, (_, name, log) in zip(axes.flat, PANELS):
        ax.set_title(name)
        ax.set_xlabel("step")
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize=8)
    save_figure(fig, title, path)


def save_figure(fig, title: str, path: str) -> None:
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fidelity(rows: dict, title: str, path: str) -> None:
    """Gradient fidelity per arm over training: cos(g_arm, g_on) and ‖g_arm − g_on‖/‖g_on‖, one line per seed;
    dotted: the cosine between two independent fp32 samples' gradients (the sampling-noise floor without coupling)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    seen = set()
    for (arm, s), r in rows.items():
        fid = fidelity_points(r)
        if not fid:
            continue
        xs = [x["step"] for x in fid]
        axes[0].plot(xs, [x["fidelity/cos"] for x in fid], "o-", ms=3, color=COLORS[arm], alpha=0.8,
                     label=arm if arm not in seen else None)
        axes[0].plot(xs, [x["fidelity/cos_resample"] for x in fid], ":", color=COLORS[arm], alpha=0.5)
        axes[1].plot(xs, [x["fidelity/rel_err"] for x in fid], "o-", ms=3, color=COLORS[arm], alpha=0.8,
                     label=arm if arm not in seen else None)
        seen.add(arm)
    axes[0].set_title("cos(g_arm, g_on-policy)  (dotted: two independent fp32 samples)")
    axes[1].set_title("‖g_arm − g_on‖ / ‖g_on‖")
    axes[1].set_yscale("symlog", linthresh=0.1)
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    save_figure(fig, title, path)


def regime_sweep(args) -> dict:
    """{(arm, seed): metrics rows} of a regime setting's runs (run_all resumes and skips finished ones)."""
    runs = {(arm, s): regime_run(args.setting, arm, s, args.common, args.runs_dir)
            for arm in args.arms for s in args.seeds}
    run_all(list(runs.values()), steps=args.steps, jobs=args.jobs, log_dir=os.path.join(args.runs_dir, "logs"))
    return {k: read_jsonl(os.path.join(out, "metrics.jsonl")) for k, (out, _) in runs.items()}


def headline(args, t0: float) -> None:
    if args.setting == "headline":
        cells = [(arm, s, args.rollout_dtype, None) for arm in args.arms for s in args.seeds]
        raw = sweep(args, cells, args.steps, args.runs_dir)
        rows = {(arm, s): raw[arm, s, args.rollout_dtype, None] for arm, s, _, _ in cells}
        setting = f"`{args.common} --steps {args.steps}`; D = {args.rollout_dtype}"
    else:
        rows = regime_sweep(args)
        setting = (f"`{args.common} --steps {args.steps}` with {args.setting}'s flags "
                   f"(`{' '.join(setting_flags(args.setting))} --mini-steps 4`)")
    _, rule, rule_text = RULES[args.rule]
    summ = {k: run_summary(v, args.rule) for k, v in rows.items()}
    table = headline_table(summ, args.arms) + "\n\n" + paired_table(summ, args.arms)
    print(table)
    plot_runs(rows, f"every arm: {args.common} --steps {args.steps}; none/r3 rollout {args.rollout_dtype}, "
                    f"oracle fp32; seeds {args.seeds}", os.path.join(args.out, "collapse.png"))
    plot_fidelity(rows, f"{args.common} --steps {args.steps}; none/r3 rollout {args.rollout_dtype}, oracle fp32",
                  os.path.join(args.out, "fidelity.png"))
    write_results(os.path.join(args.out, "collapse.json"),
                  dict(setting=args.setting, rule=rule, rule_text=rule_text, common=args.common, steps=args.steps,
                       rollout_dtype=args.rollout_dtype, arms={a: ARMS[a] for a in args.arms},
                       runs={f"{a}-s{s}": m for (a, s), m in summ.items()}), t0=t0,
                  md=f"Collapse rule (fixed before any run): {rule_text}.\n\nEvery arm: {setting}; arms differ "
                     f"only in --replay / --rollout-dtype (oracle: fp32{', no dial' * (args.setting != 'headline')})"
                     f".\n\n{table}")


def phase(args, t0: float) -> None:
    steps = args.phase_steps or args.steps
    cells = [(arm, s, d, lr) for lr in args.phase_lrs for d in args.phase_dtypes for arm in args.arms
             for s in args.phase_seeds]
    # a phase at another horizon keeps its runs apart (a run folder belongs to one command line)
    raw = sweep(args, cells, steps, args.runs_dir if steps == args.steps
                else os.path.join(args.runs_dir, f"phase{steps}"))
    data = {}
    for lr in args.phase_lrs:
        for d in args.phase_dtypes:
            for arm in args.arms:
                ms = [run_summary(raw[arm, s, d, lr]) for s in args.phase_seeds]
                data[f"{arm}|{d}|{lr:g}"] = dict(
                    arm=arm, dtype=d if arm != "oracle" else "fp32", lr=lr,
                    collapse_rate=sum(m["collapse_step"] is not None for m in ms) / len(ms),
                    collapse_steps=[m["collapse_step"] for m in ms],
                    final_reward=sum(m["final_reward"] for m in ms) / len(ms),
                    mean_kl=sum(m["mean_kl"] for m in ms) / len(ms),
                    max_grad_norm=max(m["max_grad_norm"] for m in ms))
    table = ["| lr | rollout | arm | collapse rate | collapse steps | mean final reward | mean kl | max grad norm |",
             "|---|---|---|---|---|---|---|---|"]
    for d_ in data.values():
        table.append(f"| {d_['lr']:g} | {d_['dtype']} | {d_['arm']} | {d_['collapse_rate']:.0%} | "
                     f"{d_['collapse_steps']} | {d_['final_reward']:.3f} | {d_['mean_kl']:.2e} | "
                     f"{d_['max_grad_norm']:.3g} |")
    table = "\n".join(table)
    print(table)
    plot_phase(args, data, os.path.join(args.out, "phase.png"))
    write_results(os.path.join(args.out, "phase.json"),
                  dict(rule=DIP_RULE, rule_text=DIP_RULE_TEXT, common=args.common, steps=steps, seeds=args.phase_seeds,
                       cells=data), t0=t0,
                  md=f"Collapse rule: {DIP_RULE_TEXT}.\n\nEvery run: `{with_lr(args.common, None)} --steps {steps}` "
                     f"with --lr and the rollout precision of its cell (oracle: fp32 in every column); seeds "
                     f"{args.phase_seeds}.\n\n{table}")


def plot_phase(args, data: dict, path: str) -> None:
    fig, axes = plt.subplots(1, len(args.arms), figsize=(4.2 * len(args.arms), 3.6), squeeze=False)
    for ax, arm in zip(axes[0], args.arms):
        grid = [[data[f"{arm}|{d}|{lr:g}"]["collapse_rate"] for d in args.phase_dtypes] for lr in args.phase_lrs]
        ax.imshow(grid, vmin=0, vmax=1, cmap="Reds", aspect="auto", origin="lower")
        for i, lr in enumerate(args.phase_lrs):
            for j, d in enumerate(args.phase_dtypes):
                c = data[f"{arm}|{d}|{lr:g}"]
                ax.text(j, i, f"{c['collapse_rate']:.0%}\nR {c['final_reward']:.2f}", ha="center", va="center",
                        fontsize=8, color="white" if c["collapse_rate"] > 0.5 else "black")
        ax.set_xticks(range(len(args.phase_dtypes)), args.phase_dtypes if arm != "oracle"
                      else [f"(fp32)\n{d} col." for d in args.phase_dtypes], fontsize=8)
        ax.set_yticks(range(len(args.phase_lrs)), [f"{lr:g}" for lr in args.phase_lrs])
        ax.set_xlabel("rollout precision")
        ax.set_ylabel("learning rate")
        n = len(args.phase_seeds)
        ax.set_title(f"{arm}: collapse rate ({n} seed{'s' if n > 1 else ''})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    print(f"setting: {args.setting}; collapse rule (pre-registered): {RULES[args.rule][2]}")
    if args.setting == "headline":
        print(f"every arm: train.py {args.common} --steps {args.steps} --seed S, then none: --replay none "
              f"--rollout-dtype {args.rollout_dtype} | r3: --replay r3 --rollout-dtype {args.rollout_dtype} | "
              f"oracle: --replay none --rollout-dtype fp32")
    else:
        n = regime_run(args.setting, "none", 0, args.common, args.runs_dir)[1]
        print(f"every arm: train.py {' '.join(n[:-2])} --steps {args.steps} --seed S; r3: --replay r3; oracle: "
              f"--rollout-dtype fp32 without --router-levels")
    headline(args, t0)
    if args.phase:
        phase(args, t0)
    print(f"wrote {args.out}/collapse.(md|json|png){' and phase.*' if args.phase else ''} in {time.time() - t0:.0f}s")

