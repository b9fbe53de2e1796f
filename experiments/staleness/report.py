"""The staleness grid's tables and figures: the readings' tables (analysis.py's results) and held-out accuracy against
samples seen, one panel per cell. The tables every grid shares are experiments/rules.py's.
"""
import statistics
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import matplotlib.lines  # noqa: E402

from experiments.common import fmt  # noqa: E402
from experiments.staleness.design import ENGINES, MINI_STEPS, START_FLOOR, alias  # noqa: E402

def mechanism_table(m: dict) -> str:
    lines = ["| mechanism | predicts more collapses in | than in | collapsed | Fisher p | Holm p |",
             "|---|---|---|---|---|---|"]
    for name in ("precision", "staleness"):
        lines += [f"| {name} | {r['a']} | {r['b']} | {r['counts']} | {r['p']:.3g} | {r['p_holm']:.3g} |"
                  for r in m[name]["tests"]]
    return "\n".join(lines)


def learning_table(m: dict) -> str:
    lines = ["| comparison | seeds | best held-out, a | best held-out, b | mean a - b | permutation p |",
             "|---|---|---|---|---|---|"]
    t = m["test"]
    kept = f"{', '.join(map(str, t['seeds'])) or '—'} (the test" + (
        f"; left out: {', '.join(map(str, t['left_out']))})" if t["left_out"] else ")")
    for r, seeds in [(t, kept)] + [(r, "descriptive: every finished seed, 0-2 included") for r in m["shown"]]:
        lines.append(f"| {r['a']} vs {r['b']} | {seeds} | {', '.join(fmt(x) for x in r['a_best']) or '—'} | "
                     f"{', '.join(fmt(x) for x in r['b_best']) or '—'} | {fmt(r['effect'])} | {r['p']:.3g} |")
    return "\n".join(lines)


def start_table(m: dict) -> str:
    lines = ["| seed | start (first-step reward, median) | runs | predicts | best held-out at N = 4, 8 (runs) | "
             "fits |", "|---|---|---|---|---|---|"]
    for r in m["seeds"]:
        fits = "—" if r["fits"] is None else "yes" if r["fits"] else "**no**"
        lines.append(f"| {r['seed']}{'' if r['tested'] else ' (gave the idea)'} | {fmt(r['start'])} | {r['runs']} | "
                     f"{'no climb' if r['start'] < START_FLOOR else 'a climb'} | {fmt(r['best_n4_n8'])} "
                     f"({r['n4_n8_runs']}) | {fits} |")
    return "\n".join(lines)


def plot(done: dict, cells: dict, title: str, path: str) -> None:
    """The grid's figure: rows N = 1, 4, 8, one column per engine and arm; in the N = 1 row the r2 panels (aliases)
    show the n1fresh controls instead."""
    cols = [(e, a) for e, arms in ENGINES.items() for a in arms]
    layout = [[c if alias(c) == c else f"{e}/none/n1fresh" for e, a in cols for c in [f"{e}/{a}/n{n}"]]
              for n in MINI_STEPS]
    plot_panels(done, cells, layout, title, path)


def plot_panels(done: dict, cells: dict, layout: list[list[str]], title: str, path: str) -> None:
    """Held-out accuracy against samples seen, median and min-max over seeds, and each run as a thin line (red: a
    sustained collapse), one panel per cell of `layout` (rows of cell names)."""
    nrows, ncols = len(layout), max(len(r) for r in layout)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 3 * nrows), sharex=True, sharey=True, squeeze=False)
    for i, row in enumerate(layout):
        for j, c in enumerate(row):
            ax = axes[i][j]
            series = []
            d = cells.get(c, dict(collapsed=0, n=0))
            for seed, (_, rows, _, per_step) in done.get(c, {}).items():
                series.append([((r["step"] + 1) * per_step, r["eval/accuracy"]) for r in rows
                               if r.get("eval/accuracy") is not None])
                fell = d.get("runs", {}).get(seed, {}).get("collapse_step") is not None  # runs: summarize(done)'s
                if series[-1]:
                    ax.plot(*zip(*series[-1]), lw=0.9 if fell else 0.6, color="tab:red" if fell else "0.55",
                            alpha=0.8)
            if series:
                xs = sorted({x for s in series for x, _ in s})
                at = [sorted(v for v in (dict(s).get(x) for s in series) if v is not None) for x in xs]
                ax.fill_between(xs, [v[0] for v in at], [v[-1] for v in at], alpha=0.12, label="min-max")
                ax.plot(xs, [statistics.median(v) for v in at], lw=1.8, color="tab:blue", label="median")
            if i == 0 and j == 0:
                ax.legend(handles=[matplotlib.lines.Line2D([], [], color="tab:blue", lw=1.8, label="median"),
                                   matplotlib.lines.Line2D([], [], color="0.55", lw=0.6, label="a run"),
                                   matplotlib.lines.Line2D([], [], color="tab:red", lw=0.9,
                                                           label="a run that fell (sustained)")],
                          fontsize=7, loc="upper left")
            ax.set_title(f"{c}: {d['collapsed']}/{d['n']} collapsed", fontsize=9)
            ax.set_ylim(-0.02, 1.02)
            if i == nrows - 1:
                ax.set_xlabel("samples seen")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1000:g}k"))
            if j == 0:
                ax.set_ylabel("held-out accuracy")
    fig.suptitle(textwrap.fill(title, 170), fontsize=8)  # a long flag line would run off the figure
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
