"""The precision lever: the sequence-level importance-weighted policy gradient on long responses, one mini-step.

  python -m experiments.length --sizing        # first: one step of each cell's setting at each length, timed
  python -m experiments.length --learnability  # then: the oracle (fp32, no replay) 300 steps at each length, 1 seed
  python -m experiments.length                 # the grid (resumable, --jobs 2); --report: tables from finished runs

With one mini-step there is no staleness: π_old is the policy that sampled, so the only thing between the loss and
the on-policy gradient is the precision mismatch. --loss seq_is weighs each response by w(y) = π_θ(y) / μ(y), the
product of its T token ratios, so Var[log w] ≈ 2·KL·T and the batch's effective sample size ≈ exp(-Var[log w])
falls with the response length T (r3/train/grpo.py). The task is chain:T (r3/tasks/tasks.py): a two-token prompt, a
T-token answer, each token a function of the one before it.
Cells ENGINE/ARM/TL (every other flag COMMON, each arm one flag from its neighbour):
  fp8-router/none/T   the mismatched engine, no replay       fp8-router/r3/T   the same engine, R3
  fp32/none/T         the oracle (no precision mismatch)
  at the longest length also the positive controls fp8-router/none+mis/T and fp8-router/none+tis/T
  (--is-correction on w(y): drop the rows outside [1/C, C], or truncate w at C; C = 2), run only when no replay
  collapsed there in at least one seed (CONTROLS_WHEN; --controls always / never overrides it).
The rule is the staleness grid's sustained-collapse rule (experiments/rules.py) with the held-out metric eval/reward
(the fraction of answer positions right on held-out prompts: exact match of 64+ tokens is ~0 for every arm), fixed
before any run.
Secondary rule (RELATIVE, added before any grid run, because the oracle's held-out reward at T = 1024 peaks near
0.18 in 300 steps, so a fall of 0.3 cannot happen there and the primary rule can fire only on a non-finite loss):
the same rule with "0.3 below its best / peak" read as "at most half its best / peak, once that is >= 0.1".
T* of an arm: the shortest length at which at least half its seeds collapse (None if none), under each rule.
Pre-registered prediction: T* for no replay < T* for R3 < T* for the oracle (no collapse); MIS and TIS stabilise
no replay; the measured Var[log w] follows 2·kl·T. If nothing collapses at the longest length, the page says so,
gives the measured ESS, and extrapolates from the measured Var[log w] the length where no replay's ESS < 5 %.
Writes OUT/grid.{json,md,png} in experiments.staleness's layout (cells with `collapsed` and per-seed runs; tests),
from the finished runs' records in OUT/records (committed with the tables; a fresh clone resumes, as there).
"""
import argparse
import math
import os
import statistics
import textwrap
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.common import fmt, write_results
from experiments.rules import (RULE_TEXT, _mean, cell_summary, cell_table, outcome_table, run_summary,
                               sustained_collapse, tests_table)
from experiments.stats import fisher_exact, permutation_test
from experiments.sweep import finished, run_all
from r3.runs.io import read_jsonl

ACC = "eval/reward"
RELATIVE = dict(relative=0.5, floor=0.1)  # the secondary rule: a fall to half the best (or peak), once that is >= 0.1
PRIMARY_TEXT = RULE_TEXT.split("; secondary")[0]  # the staleness grid's primary rule; its secondary is not ours
RELATIVE_TEXT = "the same with a fall to at most half its best held-out reward / reward-EMA peak (once >= 0.1)"
# The shared setting, fixed from the sizing and learnability measurements before the grid (docs/length.md):
COMMON = ("--preset toy --warmup-steps 40 --prompts-per-step 2 --group-size 8 --mini-steps 1 --loss seq_is "
          "--old-logp engine --grad-clip inf --lr 3e-4 --eval-every 25 --eval-prompts 8 --eval-samples 2 "
          "--val-every 0 --dump-every 0 --mismatch-every 5 --save-every 25 --is-cap 2")
LENGTHS = (64, 256, 1024)
STEPS = 200
SEEDS = tuple(range(6))
LEARN_STEPS = 300
ARMS = {"fp8-router/none": ("fp8-router", "none", "none"), "fp8-router/r3": ("fp8-router", "r3", "none"),
        "fp32/none": ("fp32", "none", "none")}
CONTROLS = {"fp8-router/none+mis": ("fp8-router", "none", "mis"), "fp8-router/none+tis": ("fp8-router", "none", "tis")}
PAIRS = [("fp8-router/none/T{T}", "fp8-router/r3/T{T}"), ("fp8-router/none/T{T}", "fp32/none/T{T}"),
         ("fp8-router/r3/T{T}", "fp32/none/T{T}")]


def cells(lengths) -> list[str]:
    return [f"{a}/T{t}" for t in lengths for a in ARMS] + [f"{c}/T{max(lengths)}" for c in CONTROLS]


def cell_run(cell: str, seed: int, runs_dir: str, common: str) -> tuple[str, list[str]]:
    *arm, tl = cell.split("/")
    engine, replay, corr = {**ARMS, **CONTROLS}["/".join(arm)]
    flags = [*common.split(), "--task", f"chain:{tl[1:]}", "--replay", replay, "--rollout-dtype", engine,
             "--is-correction", corr, "--seed", str(seed)]
    return os.path.join(runs_dir, cell.replace("/", "-").replace("+", "-") + f"-s{seed}"), flags


def summary(commit: str | None, rows: list[dict], T: int) -> dict:
    m = run_summary(commit, rows, acc=ACC)
    m["secondary_step"], m["secondary_why"] = sustained_collapse(rows, ACC, **RELATIVE)
    measured = [r for r in rows if r.get("kl") is not None and r.get("seq_is/var_log_w") is not None]
    pairs = [(r["seq_is/var_log_w"], 2 * r["kl"] * r["response_length"]) for r in measured]
    m.update(length=T, mean_ess=_mean([r.get("seq_is/ess_frac") for r in rows]),
             min_ess=min((r["seq_is/ess_frac"] for r in rows if r.get("seq_is/ess_frac") is not None), default=None),
             mean_var_log_w=_mean([v for v, _ in pairs]), predicted_var_log_w=_mean([p for _, p in pairs]),
             mean_response_length=_mean([r["response_length"] for r in measured]),
             max_log_w=max((r["seq_is/max_log_w"] for r in rows if r.get("seq_is/max_log_w") is not None),
                           default=None))
    return m


def extrapolate(summ: dict) -> tuple[float | None, float | None, str]:
    """No replay's Var[log w] per sampled token and per unit of nominal T (lines through 0 over its runs), and the
    sentence that says where its ESS ≈ exp(-Var[log w]) would fall below 5 % (Var[log w] > ln 20). Var[log w] ≈
    2·kl·(tokens sampled), so the per-token line is the one the theory speaks of; responses stop short of T."""
    runs = [r for c, d in summ.items() if c.startswith("fp8-router/none/") for r in d["runs"].values()
            if r["mean_var_log_w"]]
    if not runs:
        return None, None, ""
    var = sum(r["mean_var_log_w"] for r in runs)
    slope, slope_T = var / sum(r["mean_response_length"] for r in runs), var / sum(r["length"] for r in runs)
    return slope, slope_T, (
        f"No replay's measured Var[log w] grows {fmt(slope)} per sampled token (a line through 0 against each run's "
        f"mean response length): its ESS would fall below 5 % at responses of ≈ {fmt(math.log(20) / slope, spec='.0f')}"
        f" tokens. Against the nominal T instead (responses stop short of it): {fmt(slope_T)} per unit of T, "
        f"T ≈ {fmt(math.log(20) / slope_T, spec='.0f')}")


CONTROLS_WHEN = ("they run once every seed of no replay at the longest length has finished, and only if at least "
                 "one of them collapsed under the primary or the secondary rule: MIS and TIS are there to stabilise "
                 "no replay, and without a fall there is nothing to stabilise (added at 47 of 66 runs, no replay 0 "
                 "of 4 at T = 1024 so far, to keep the study near the issue's budget: docs/length.md)")


def controls_needed(summ: dict, lengths, seeds: int) -> tuple[bool, str]:
    """(run the positive controls?, why): CONTROLS_WHEN, read from the finished runs."""
    c = summ[f"fp8-router/none/T{max(lengths)}"]
    fell = sum((r["collapse_step"] is not None) or (r["secondary_step"] is not None) for r in c["runs"].values())
    if c["n"] < seeds:
        return False, f"waiting: {c['n']} of {seeds} no-replay seeds at T = {max(lengths)} have finished"
    if fell:
        return True, f"run: no replay collapsed in {fell} of {seeds} seeds at T = {max(lengths)}"
    return False, (f"not run: the no-replay arm collapsed in none of its {seeds} seeds at T = {max(lengths)}, under "
                   "either rule, so the prediction that MIS and TIS stabilise it cannot be tested here")


def summarize(plan: list, names: list[str], steps: int, records: str) -> tuple[dict, dict]:
    """(per cell: collapse counts and per-seed summaries of the finished runs; {cell: {seed: (commit, rows)}} of
    those runs, for the figure), read from their records."""
    done = {}
    for c, s, out, flags in plan:
        if (rec := finished(out, flags, steps, records)) is not None:
            done.setdefault(c, {})[s] = (rec[0]["commit"], rec[1])
    summ = {c: cell_summary({s: summary(o, rows, int(c.split("/T")[-1]))
                             for s, (o, rows) in sorted(done.get(c, {}).items())}) for c in names}
    return summ, done


def t_star(cells_summ: dict, arm: str, lengths, key: str = "collapsed") -> int | None:
    for t in sorted(lengths):
        c = cells_summ.get(f"{arm}/T{t}")
        if c and c["n"] and c[key] * 2 >= c["n"]:
            return t
    return None


def tests(summ: dict, lengths) -> list[dict]:
    res = []
    pairs = [(a.format(T=t), b.format(T=t)) for t in lengths for a, b in PAIRS]
    pairs += [(f"fp8-router/none/T{max(lengths)}", f"{c}/T{max(lengths)}") for c in CONTROLS]
    for a, b in pairs:
        if a in summ and b in summ and summ[a]["n"] and summ[b]["n"]:  # a partial grid: only cells with runs
            ca, cb = summ[a], summ[b]
            da, db = ([r["max_drawdown"] for r in c["runs"].values() if r["max_drawdown"] is not None]
                      for c in (ca, cb))
            res.append(dict(a=a, b=b, metric="collapsed", p=fisher_exact(ca["collapsed"], ca["n"], cb["collapsed"],
                                                                           cb["n"]),
                            effect=ca["collapsed"] / ca["n"] - cb["collapsed"] / cb["n"] if ca["n"] and cb["n"]
                            else None, counts=f"{ca['collapsed']}/{ca['n']} vs {cb['collapsed']}/{cb['n']}"))
            res.append(dict(a=a, b=b, metric="collapsed_relative",
                            p=fisher_exact(ca["secondary_collapsed"], ca["n"], cb["secondary_collapsed"], cb["n"]),
                            effect=ca["secondary_collapsed"] / ca["n"] - cb["secondary_collapsed"] / cb["n"]
                            if ca["n"] and cb["n"] else None,
                            counts=f"{ca['secondary_collapsed']}/{ca['n']} vs {cb['secondary_collapsed']}/{cb['n']}"))
            res.append(dict(a=a, b=b, metric="max_drawdown", p=permutation_test(da, db),
                            effect=_mean(da) - _mean(db) if da and db else None,
                            counts=f"mean {fmt(_mean(da))} vs {fmt(_mean(db))}"))
    return res


def plot(done: dict, summ: dict, lengths, title: str, path: str) -> None:
    """Per length: held-out reward and the ESS of the sequence weights over steps (median over seeds), each arm;
    last panel: measured Var[log w] against its prediction 2·kl·T."""
    fig, axes = plt.subplots(2, len(lengths) + 1, figsize=(4.5 * (len(lengths) + 1), 7), squeeze=False)
    colors = {"fp8-router/none": "tab:red", "fp8-router/r3": "tab:blue", "fp32/none": "tab:gray",
              "fp8-router/none+mis": "tab:orange", "fp8-router/none+tis": "tab:green"}
    for j, t in enumerate(lengths):
        for arm, color in colors.items():
            runs = done.get(f"{arm}/T{t}", {})
            for i, key in enumerate((ACC, "seq_is/ess_frac")):
                series = [{r["step"]: r[key] for r in rows if r.get(key) is not None} for _, rows in runs.values()]
                steps = sorted({s for d in series for s in d})
                med = [statistics.median(d[s] for d in series if s in d) for s in steps]
                if steps:
                    axes[i][j].plot(steps, med, color=color, lw=1.2, label=f"{arm} ({len(series)})")
        axes[0][j].set_title(f"T = {t}: held-out reward (median)", fontsize=9)
        axes[1][j].set_title(f"T = {t}: ESS of w(y) / rows (median)", fontsize=9)
        axes[0][j].legend(fontsize=7)
    ax = axes[0][-1]
    for c, d in summ.items():
        for r in d["runs"].values():
            if r["mean_var_log_w"] is not None:
                ax.scatter(r["predicted_var_log_w"], r["mean_var_log_w"], s=12,
                           color=colors["/".join(c.split("/")[:-1])])
    lim = max([1e-3] + [max(r["predicted_var_log_w"] or 0, r["mean_var_log_w"] or 0) for d in summ.values()
                        for r in d["runs"].values()])
    ax.plot([0, lim], [0, lim], "k:", lw=1)
    ax.set_xlabel("predicted 2·kl·T")
    ax.set_ylabel("measured Var[log w]")
    ax.set_title("Var[log w]: measured vs predicted", fontsize=9)
    axes[1][-1].axis("off")
    fig.suptitle(textwrap.fill(title, 230), fontsize=8)  # a long flag line would run off the figure
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def sizing(args) -> None:
    """One fp8-router/none run of 3 steps per length: step 0 measures the mismatch, step 1 is a plain step, step 2
    also evaluates (the last step); the cost of a grid run follows from the cadences in COMMON. Also the kl per
    token at step 0 and the effective sample size it predicts for a response of the full length, exp(-2·kl·T), and
    for the responses actually sampled, exp(-2·kl·mean length). Writes OUT/sizing.{json,md}."""
    t0 = time.time()
    lines = ["| T | plain step s | + mismatch s | + evaluation s | est. s per run of --steps | est. grid core-hours | "
             "kl per token (step 0) | mean response length (step 0) | predicted ESS at T | at the mean length |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    flag = lambda name: int(args.common.split()[args.common.split().index(name) + 1])  # noqa: E731
    total, rows_out = 0.0, []
    for t in args.lengths:
        out, flags = cell_run(f"fp8-router/none/T{t}", 0, os.path.join(args.out, "sizing"), args.common)
        run_all([(out, [*flags, "--overwrite"], 3)], jobs=1, log_dir=os.path.join(args.out, "sizing", "logs"))
        rows = read_jsonl(os.path.join(out, "metrics.jsonl"))
        st = [r["step_time"] for r in rows]
        per_run = args.steps * st[1] + args.steps / flag("--mismatch-every") * (st[0] - st[1]) \
            + args.steps / flag("--eval-every") * (st[2] - st[1])
        runs = len(args.seeds) * (len(ARMS) + (len(CONTROLS) if t == max(args.lengths) else 0))
        total += per_run * runs
        kl, length = rows[0]["kl"], rows[0]["response_length"]
        ess_t, ess_len = math.exp(-2 * kl * t), math.exp(-2 * kl * length)
        rows_out.append(dict(length=t, step_times_s=st, est_run_s=per_run, runs=runs, kl=kl,
                             response_length=length, var_log_w=rows[0]["seq_is/var_log_w"],
                             ess_frac=rows[0]["seq_is/ess_frac"], predicted_ess_full=ess_t,
                             predicted_ess_mean_length=ess_len))
        lines.append(f"| {t} | {st[1]:.2f} | {st[0] - st[1]:.2f} | {st[2] - st[1]:.2f} | {per_run:.0f} | "
                     f"{per_run * runs / 3600:.1f} ({runs} runs) | {kl:.2e} | {length:.1f} | {ess_t:.0%} | "
                     f"{ess_len:.0%} |")
    kl0 = min(rows_out, key=lambda r: r["length"])["kl"]
    need = math.log(5) / (2 * kl0)
    md = "\n".join(lines) + (
        f"\n\ntotal: {total / 3600:.1f} core-hours, {total / 3600 / args.jobs:.1f} h wall at --jobs {args.jobs} "
        f"(step times of one run each, so the estimate is rough: a step costs what its longest response costs)."
        f"\n\nAt the shortest length's kl ({kl0:.2e} per token), exp(-2·kl·T) <= 20 % needs responses of "
        f"T >= {need:.0f} tokens.\n\nEvery run: `{args.common}` with `--task chain:T --replay none "
        f"--rollout-dtype fp8-router --seed 0`, 3 steps; estimates for {args.steps} steps x {len(args.seeds)} seeds.")
    print(md)
    write_results(os.path.join(args.out, "sizing.json"),
                  dict(lengths=list(args.lengths), steps=args.steps, seeds=list(args.seeds), common=args.common,
                       rows=rows_out, est_core_hours=total / 3600, min_length_for_ess_20=need), t0=t0, md=md)


def learnability(args) -> None:
    """The oracle (fp32 engine, no replay), seed 0, 300 steps at each length: does the toy learn chain:T?
    Writes OUT/learnability.{json,md}."""
    t0 = time.time()
    runs = [cell_run(f"fp32/none/T{t}", 0, os.path.join(args.out, "learn_runs"), args.common) for t in args.lengths]
    run_all([(out, flags, LEARN_STEPS) for out, flags in runs], jobs=args.jobs,
            log_dir=os.path.join(args.out, "learn_runs", "logs"))
    lines = ["| T | reward, first 10 steps | reward, last 10 steps | held-out reward first / best / last | "
             "mean response length, first / last 10 steps |", "|---|---|---|---|---|"]
    rows_out = []
    for t, (out, _) in zip(args.lengths, runs):
        rows = read_jsonl(os.path.join(out, "metrics.jsonl"))
        ev = [r[ACC] for r in rows if r.get(ACC) is not None]
        d = dict(length=t, reward_first10=_mean([r["reward"] for r in rows[:10]]),
                 reward_last10=_mean([r["reward"] for r in rows[-10:]]), heldout_first=ev[0], heldout_best=max(ev),
                 heldout_last=ev[-1], length_first10=_mean([r["response_length"] for r in rows[:10]]),
                 length_last10=_mean([r["response_length"] for r in rows[-10:]]))
        rows_out.append(d)
        lines.append(f"| {t} | {d['reward_first10']:.3f} | {d['reward_last10']:.3f} | {d['heldout_first']:.3f} / "
                     f"{d['heldout_best']:.3f} / {d['heldout_last']:.3f} | {d['length_first10']:.1f} / "
                     f"{d['length_last10']:.1f} |")
    pending = [t for t in LENGTHS if t not in args.lengths]
    md = "\n".join(lines) + (f"\n\nEvery run: `{args.common}` with `--task chain:T --replay none --rollout-dtype "
                             f"fp32 --seed 0`, {LEARN_STEPS} steps; held-out metric `{ACC}`."
                             + (f"\n\n**partial**: lengths {pending} of LENGTHS not run yet." if pending else ""))
    print(md)
    write_results(os.path.join(args.out, "learnability.json"),
                  dict(lengths=list(args.lengths), steps=LEARN_STEPS, common=args.common, rows=rows_out,
                       complete=not pending), t0=t0, md=md)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizing", action="store_true", help="time one step at each length and estimate the grid")
    p.add_argument("--learnability", action="store_true", help="the oracle, 300 steps at each length")
    p.add_argument("--report", action="store_true", help="launch nothing: tables from the finished runs")
    p.add_argument("--controls", choices=("auto", "always", "never"), default="auto",
                   help="the positive controls (MIS, TIS) at the longest length: auto = by CONTROLS_WHEN (after no "
                        "replay's seeds there, only if one collapsed)")
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS), help="answer lengths T")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="seeds per cell")
    p.add_argument("--steps", type=int, default=STEPS, help="RL steps per run")
    p.add_argument("--common", default=COMMON, help="train.py flags every cell shares (tests and probes only)")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    p.add_argument("--out", default="results/length", help="output folder (runs in OUT/runs)")
    p.add_argument("--records", default=None, help="run records folder (default OUT/records; with --report, tables "
                                                   "from records made elsewhere, e.g. the committed ones)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.sizing or args.learnability:
        return sizing(args) if args.sizing else learnability(args)
    t0 = time.time()
    print(f"rule (pre-registered): {PRIMARY_TEXT}; held-out metric {ACC}; secondary: {RELATIVE_TEXT}; T* = shortest "
          f"length where >= half the seeds collapse")
    names, runs_dir = cells(args.lengths), os.path.join(args.out, "runs")
    # shortest length first, seed-major within a length: a partial grid holds whole lengths, balanced across cells;
    # the positive controls at the longest length come last, and only if CONTROLS_WHEN holds (controls_needed)
    plan = [(c, s, *cell_run(c, s, runs_dir, args.common)) for t in sorted(args.lengths) for s in args.seeds
            for c in names if c.endswith(f"/T{t}") and c.rsplit("/", 1)[0] not in CONTROLS]
    controls = [(c, s, *cell_run(c, s, runs_dir, args.common)) for s in args.seeds for c in names
                if c.rsplit("/", 1)[0] in CONTROLS]
    records = args.records or os.path.join(args.out, "records")  # committed: a fresh clone resumes and reports
    if not args.report:
        run_all([(out, flags, args.steps) for _, _, out, flags in plan], jobs=args.jobs,
                log_dir=os.path.join(runs_dir, "logs"), records=records)
    summ, done = summarize(plan + controls, names, args.steps, records)
    needed, why = controls_needed(summ, args.lengths, len(args.seeds))
    if args.controls != "auto":
        needed, why = args.controls == "always", f"{'run' if args.controls == 'always' else 'not run'}: " \
                                                 f"--controls {args.controls} (the rule was not applied)"
    print(f"positive controls: {why}")
    if needed and not args.report:
        run_all([(out, flags, args.steps) for _, _, out, flags in controls], jobs=args.jobs,
                log_dir=os.path.join(runs_dir, "logs"), records=records)
        summ, done = summarize(plan + controls, names, args.steps, records)
    ts = tests(summ, args.lengths)
    complete = all(d["n"] == len(args.seeds) for c, d in summ.items()
                   if needed or c.rsplit("/", 1)[0] not in CONTROLS)
    stars = {a: t_star(summ, a, args.lengths) for a in {**ARMS, **CONTROLS}}
    stars_rel = {a: t_star(summ, a, args.lengths, "secondary_collapsed") for a in {**ARMS, **CONTROLS}}
    ess = ["| cell | mean ESS / rows | min ESS | measured Var[log w] | predicted 2·kl·T | largest log w |",
           "|---|---|---|---|---|---|"]
    for c, d in summ.items():
        rs = list(d["runs"].values())
        ess.append(f"| {c} | {fmt(_mean([r['mean_ess'] for r in rs]))} | {fmt(_mean([r['min_ess'] for r in rs]))} |"
                   f" {fmt(_mean([r['mean_var_log_w'] for r in rs]))} | "
                   f"{fmt(_mean([r['predicted_var_log_w'] for r in rs]))} | "
                   f"{fmt(max((r['max_log_w'] for r in rs if r['max_log_w'] is not None), default=None))} |")
    slope, slope_T, extrapolation = extrapolate(summ)
    n_ctl = sum(d["n"] for c, d in summ.items() if c.rsplit("/", 1)[0] in CONTROLS)
    status = "" if complete else (f"**partial**: {sum(d['n'] for d in summ.values()) - n_ctl} of {len(plan)} runs "
                                  f"of the three arms finished" + (f", {n_ctl} of {len(controls)} of the positive "
                                                                   f"controls" if needed else ""))
    md = "\n\n".join(x for x in [
        f"Rule (fixed before any run): {PRIMARY_TEXT}; held-out metric `{ACC}`. Secondary (fixed before any grid "
        f"run): {RELATIVE_TEXT}.",
        f"Every run: `{args.common} --steps {args.steps}` with `--task chain:T` and its cell's --replay, "
        f"--rollout-dtype, --is-correction; seeds {list(args.seeds)}.", status,
        f"Positive controls (rule: {CONTROLS_WHEN}): {why}.",
        cell_table(summ, names, "relative"), "\n".join(ess),
        "T* (shortest length where >= half the seeds collapse): " + ", ".join(f"{a} {t}" for a, t in stars.items()),
        "T* under the secondary (relative) rule: " + ", ".join(f"{a} {t}" for a, t in stars_rel.items()),
        extrapolation, "### Every run, by seed\n\n" + outcome_table(summ, names, args.seeds, "relative"),
        "### Tests\n\n" + tests_table(ts)] if x)
    print(md)
    plot(done, summ, args.lengths, f"{args.common} --steps {args.steps}; {status or 'complete'}",
         os.path.join(args.out, "grid.png"))
    write_results(os.path.join(args.out, "grid.json"),
                  dict(steps=args.steps, lengths=list(args.lengths), seeds=list(args.seeds), rule=PRIMARY_TEXT,
                       heldout_metric=ACC, secondary_rule=RELATIVE_TEXT, complete=complete, common=args.common,
                       controls_run=needed, controls_why=why, cells=summ, tests=ts, t_star=stars,
                       t_star_relative=stars_rel, var_log_w_per_token=slope,
                       var_log_w_per_unit_T=slope_T), t0=t0, md=md)

