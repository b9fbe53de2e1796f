"""What moves before a fall: each sustained collapse of the staleness grid, its telemetry in the steps before it
beside the same cell's stable seeds over the same steps.

  python -m experiments.staleness.falls   # results/staleness/falls.{json,md,png}, from the committed records (seconds)

Exploratory, not pre-registered: the grid's rule and tests (experiments/staleness/design.py) decide its outcome; this
page only looks at what the logged telemetry did before the falls, to suggest a mechanism, not to prove one.

The window. A collapse by the held-out rule is first seen at an evaluation step C; the evaluation before it (C - 50)
was still within 0.3 of the best, so the fall began after C - 50. The window is the 50 steps before that evaluation,
[C - 100, C - 50): the run before it fell. For each metric, the fallen run's median over the window is set beside
the median, over the cell's seeds that never collapsed, of their own medians over the same steps. The summary per
metric: over the held-out falls, how often the fallen run's value was the larger, the geometric mean of the ratio,
and an exact sign-flip test on the log ratios (p values exploratory, not corrected for the metrics tried). The same
for the fall itself, [C - 50, C].

Height-matched (added at 91 runs, after the same-steps comparison had shown the fallen runs higher; its rule was
written before it was computed). A run can only fall from a height, and height alone moves entropy, gradients and
perhaps the engine's flips, so each window before a held-out fall is also set beside windows of the same height:
every window of the same length that starts at an evaluation, in a run that never collapsed (by the grid's sustained
rule; a dip by its secondary rule does not exclude a run), of any cell with the same engine and the same N, whose
held-out accuracy at that evaluation is within HEIGHT_TOL of the fallen run's at the start of its window (n1fresh:
both windows start at the block that holds the evaluation). The reference is the median over those runs of each
run's median over its matched windows (so a long plateau counts once), at whatever step they came; a fall with no
matched window is left out. An earlier note (docs/staleness.md, at 91 runs) sketched the match at the same step;
at any step was chosen, before computing it, because few stable runs share a height at one step."""
import argparse
import json
import math
import os
import statistics
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.common import fmt, write_results  # noqa: E402
from experiments.staleness.design import FRESH, alias, cell_run  # noqa: E402
from experiments.stats import paired_permutation_test  # noqa: E402
from experiments.sweep import flag_value, read_record  # noqa: E402
from r3.errors import InputError, run_main  # noqa: E402

METRICS = {"eval/accuracy": "held-out accuracy", "grad_norm": "grad norm",
           "grpo/max_abs_log_ratio": "largest abs log ratio", "entropy": "entropy",
           "kl": "kl (engine vs trainer)", "staleness/router_flip_rate": "staleness flips",
           "router_flip_rate": "engine flips"}
PLOTTED = ("eval/accuracy", "grad_norm", "grpo/max_abs_log_ratio", "staleness/router_flip_rate")
# Below these a value is rounding, not a measurement: the fp32 engine's kl against the trainer is ~1e-14.
FLOOR = {"kl": 1e-10}
# The windows are defined by the evaluations around a held-out fall. A collapse by the reward-EMA or non-finite
# criteria has no such bracket (the EMA lags and a slow decline may begin before C - 100), so those falls are listed
# but not summarised.
SUMMARIZED = ("heldout_drop",)
HEIGHT_TOL = 0.05  # height-matched reference: held-out accuracy within this of the fallen run's
SMOOTH = 10  # every-step metrics are drawn as means over this many steps (an all-equal-reward step has grad norm 0)


def series(rows: list[dict], metric: str, lo: int, hi: int) -> list[tuple[int, float]]:
    """(step, value) of a metric between lo and hi; every-step metrics as means over SMOOTH-step bins."""
    pts = [(r["step"], r[metric]) for r in rows if lo <= r["step"] <= hi and r.get(metric) is not None]
    if metric not in ("grad_norm", "grpo/max_abs_log_ratio"):
        return pts
    bins = {}
    for step, v in pts:
        bins.setdefault(step // SMOOTH, []).append(v)
    return [(b * SMOOTH + SMOOTH // 2, sum(v) / len(v)) for b, v in sorted(bins.items())]


def window_median(rows: list[dict], metric: str, lo: int, hi: int) -> float | None:
    """Median of a metric over the rows with lo <= step < hi (raw steps), None when it was not logged there."""
    vals = [r[metric] for r in rows if lo <= r["step"] < hi and r.get(metric) is not None
            and math.isfinite(r[metric])]
    return statistics.median(vals) if vals else None


def load(grid_dir: str) -> tuple[dict, dict]:
    """(grid.json, {(cell, seed): metrics rows}) for every finished run of a distinct cell."""
    path = os.path.join(grid_dir, "grid.json")
    if not os.path.exists(path):
        raise InputError(f"{path}: no grid table; run `python -m experiments.staleness --report` first")
    with open(path) as f:
        grid = json.load(f)
    rows = {}
    for cell, c in grid["cells"].items():
        if alias(cell) != cell:
            continue
        for seed in c["runs"]:
            name = os.path.basename(cell_run(cell, int(seed), grid["lr"], "runs", grid["common"])[0])
            rows[cell, seed] = read_record(os.path.join(grid_dir, "records", name + ".jsonl.gz"))[1]
    return grid, rows


def falls(grid: dict, rows: dict, window: int) -> list[dict]:
    """One entry per sustained collapse: its window and, per metric, the fallen run's and the stable seeds' medians."""
    out = []
    for cell, c in grid["cells"].items():
        if alias(cell) != cell:
            continue
        scale = FRESH if cell.endswith("fresh") else 1  # n1fresh: steps are read in blocks of 4
        stable = [s for s, r in c["runs"].items() if r["collapse_step"] is None]
        for seed, r in c["runs"].items():
            step = r["collapse_step"]
            if step is None:
                continue
            lo, hi = max(0, step - 2 * window) * scale, (step - window) * scale
            entry = dict(cell=cell, seed=int(seed), collapse_step=step, why=r["why"], window=[lo, hi],
                         fall=[hi, (step + 1) * scale], stable_seeds=[int(s) for s in stable], metrics={})
            for m in METRICS:
                entry["metrics"][m] = {}
                for key, (a, b) in (("", (lo, hi)), ("_during", (hi, (step + 1) * scale))):
                    others = [v for s in stable if (v := window_median(rows[cell, s], m, a, b)) is not None]
                    entry["metrics"][m].update({"fallen" + key: window_median(rows[cell, seed], m, a, b)
                                                if b > a else None,
                                                "stable" + key: statistics.median(others) if others else None})
            out.append(entry)
    return out


def match_heights(grid: dict, rows: dict, found: list[dict], tol: float = HEIGHT_TOL) -> None:
    """Add to each held-out fall its height-matched reference (module docstring): `matched` (height, runs, windows)
    and, per metric, "fallen_matched" (the fallen run's window median) and "stable_matched"."""
    never = [(cell, seed) for cell, c in grid["cells"].items() if alias(cell) == cell
             for seed, r in c["runs"].items() if r["collapse_step"] is None]
    for e in found:
        lo, hi = e["window"]
        height = window_median(rows[e["cell"], str(e["seed"])], "eval/accuracy", lo, hi)
        if e["why"] not in SUMMARIZED or height is None:
            continue
        engine, _, n = e["cell"].split("/")
        lead = FRESH - 1 if n.endswith("fresh") else 0  # n1fresh: an evaluation is logged at its block's last step
        per_run = {}  # (cell, seed) -> its matched windows' starts
        for cell, seed in never:
            if cell.split("/")[0] != engine or cell.split("/")[2] != n:
                continue
            last = rows[cell, seed][-1]["step"]
            per_run[cell, seed] = [r["step"] - lead for r in rows[cell, seed] if r.get("eval/accuracy") is not None
                                   and abs(r["eval/accuracy"] - height) <= tol
                                   and r["step"] - lead + hi - lo <= last + 1]  # the whole window was logged
        per_run = {k: v for k, v in per_run.items() if v}
        e["matched"] = dict(height=height, tol=tol, runs=len(per_run), windows=sum(map(len, per_run.values())))
        for m in METRICS:
            meds = [statistics.median(vals) for k, starts in per_run.items()
                    if (vals := [v for a in starts if (v := window_median(rows[k], m, a, a + hi - lo)) is not None])]
            e["metrics"][m].update(fallen_matched=e["metrics"][m]["fallen"],
                                   stable_matched=statistics.median(meds) if meds else None)


def summarize(found: list[dict], key: str = "") -> dict:
    """Per metric, over the held-out falls (SUMMARIZED): the fallen run against its stable seeds in the window before
    (key "") or during (key "_during") the fall, or against its height-matched reference (key "_matched": only the
    falls that have one). A pair is compared only when both values exceed the metric's FLOOR."""
    summ = {}
    for m in METRICS:
        pairs = [(e["metrics"][m]["fallen" + key], e["metrics"][m]["stable" + key]) for e in found
                 if e["why"] in SUMMARIZED and (key != "_matched" or "matched" in e)]
        floor = FLOOR.get(m, 0.0)
        logs = [math.log(a / b) for a, b in pairs if (a or 0) > floor and (b or 0) > floor]
        summ[m] = dict(n=len(logs), fallen_larger=sum(x > 0 for x in logs),
                       geo_mean_ratio=math.exp(sum(logs) / len(logs)) if logs else None,
                       p=paired_permutation_test(logs) if logs else None)
    return summ


def plot(found: list[dict], grid: dict, rows: dict, window: int, path: str) -> None:
    n = max(1, len(found))
    fig, axes = plt.subplots(n, len(PLOTTED), figsize=(4 * len(PLOTTED), 2.4 * n), squeeze=False)
    for i, e in enumerate(found):
        scale = FRESH if e["cell"].endswith("fresh") else 1
        c0 = e["collapse_step"] * scale
        lo, hi = c0 - 5 * window * scale, c0 + 2 * window * scale
        for j, m in enumerate(PLOTTED):
            ax = axes[i][j]
            for s in [*e["stable_seeds"], e["seed"]]:
                pts = series(rows[e["cell"], str(s)], m, lo, hi)
                if pts:
                    ax.plot(*zip(*pts), **(dict(color="tab:red", lw=1.0) if s == e["seed"] else
                                           dict(color="0.6", lw=0.7)))
            ax.axvspan(*e["window"], color="tab:orange", alpha=0.15)
            ax.axvline(c0, color="k", lw=0.6, ls="--")
            if m in ("grad_norm", "grpo/max_abs_log_ratio"):
                ax.set_yscale("log")
            ax.set_title(f"{e['cell']} s{e['seed']}: {METRICS.get(m, 'held-out accuracy')}", fontsize=8)
            ax.tick_params(labelsize=7)
    if not found:
        axes[0][0].text(0.5, 0.5, "no sustained collapse yet", ha="center", transform=axes[0][0].transAxes)
    fig.suptitle(f"before each sustained collapse (red; dashed: the step it was seen; shaded: the window) and the "
                 f"same cell's stable seeds (grey); grad norm and log ratio as {SMOOTH}-step means", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", default="results/staleness", help="the grid's folder (grid.json and records/)")
    p.add_argument("--out", default=None, help="output folder (default: the grid's)")
    args = p.parse_args(argv)
    t0 = time.time()
    grid, rows = load(args.grid)
    window = int(flag_value(grid["common"].split(), "--eval-every", "50"))
    found = falls(grid, rows, window)
    match_heights(grid, rows, found)
    summ, during, matched = summarize(found), summarize(found, "_during"), summarize(found, "_matched")
    lines = [f"Exploratory (not pre-registered): telemetry over the {window} steps before the evaluation that "
             f"preceded each sustained collapse, the fallen run's median against the median of the same cell's "
             f"stable seeds over the same steps. {len(found)} collapses in {len(rows)} finished runs"
             f"{'' if grid['complete'] else ' (the grid is partial)'}.", "",
             "| cell | seed | collapse step | why | window | " + " | ".join(METRICS.values()) + " |",
             "|---" * (5 + len(METRICS)) + "|"]
    for e in found:
        cells = [f"{fmt(v['fallen'])} vs {fmt(v['stable'])}" for v in e["metrics"].values()]
        lines.append(f"| {e['cell']} | {e['seed']} | {e['collapse_step']} | {e['why']} | "
                     f"{e['window'][0]}-{e['window'][1]} | " + " | ".join(cells) + " |")
    lines += ["", "Entries: the fallen run vs its cell's stable seeds (— where the metric was not logged in the "
              "window, or the cell has no stable seed yet). The comparison is not matched on how far a run had "
              "climbed: a run can only fall from a height, and a policy that has solved more of the task has less "
              "entropy and smaller gradients, so held-out accuracy is shown first. Each stable reference is "
              "whichever seeds of the cell did not fall, at whatever level they had reached. Summarised below: the "
              f"falls by {', '.join(SUMMARIZED)} only (the windows bracket a held-out fall); since the test "
              "compares log ratios, a pair counts only when both values are above 0 (kl: above "
              f"{FLOOR['kl']:g}, below which it is rounding)."]
    for title, table in ((f"Before the fall, [C - {2 * window}, C - {window}):", summ),
                         (f"During the fall, [C - {window}, C] (the steps in which held-out accuracy fell):",
                          during)):
        lines += ["", title, "", "| metric | falls compared | fallen run larger | geometric mean ratio | "
                  "sign-flip p (exploratory) |", "|---|---|---|---|---|"]
        lines += [f"| {METRICS[m]} | {s['n']} | {s['fallen_larger']} | {fmt(s['geo_mean_ratio'])} | "
                  f"{fmt(s['p'])} |" for m, s in table.items()]
    unmatched = sum(1 for e in found if e["why"] in SUMMARIZED and not e.get("matched", {}).get("runs"))
    lines += ["", f"Height-matched, before the fall: each fallen run's window against windows of {window} steps "
              f"(n1fresh: {window * FRESH} raw steps) that start at an evaluation within {HEIGHT_TOL} of its "
              "held-out accuracy, in runs of the same engine and N with no sustained collapse (dips by the "
              "secondary rule allowed), at any step (the median over runs of each run's median). Added at 91 "
              f"runs, after the table above; exploratory. {unmatched} of the "
              f"{sum(e['why'] in SUMMARIZED for e in found)} held-out falls have no matched window and are left "
              "out of the summary.", "",
              "| cell | seed | height | matched runs (windows) | " + " | ".join(METRICS.values()) + " |",
              "|---" * (4 + len(METRICS)) + "|"]
    for e in found:
        if "matched" in e:
            cells = [f"{fmt(v['fallen_matched'])} vs {fmt(v['stable_matched'])}" for v in e["metrics"].values()]
            lines.append(f"| {e['cell']} | {e['seed']} | {fmt(e['matched']['height'])} | {e['matched']['runs']} "
                         f"({e['matched']['windows']}) | " + " | ".join(cells) + " |")
    lines += ["", "| metric | falls compared | fallen run larger | geometric mean ratio | sign-flip p (exploratory) |",
              "|---|---|---|---|---|"]
    lines += [f"| {METRICS[m]} | {s['n']} | {s['fallen_larger']} | {fmt(s['geo_mean_ratio'])} | {fmt(s['p'])} |"
              for m, s in matched.items()]
    md = "\n".join(lines)
    print(md)
    out = args.out or args.grid
    os.makedirs(out, exist_ok=True)
    plot(found, grid, rows, window, os.path.join(out, "falls.png"))
    write_results(os.path.join(out, "falls.json"), dict(window=window, complete=grid["complete"], falls=found,
                                                        summary=summ, summary_during=during,
                                                        summary_matched=matched, height_tol=HEIGHT_TOL),
                  t0=t0, md=md)


if __name__ == "__main__":
    run_main(main)
