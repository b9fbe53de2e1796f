"""The regime grid's figures: every run's held-out curve per cell (grid.png), every run's train-inference kl over
training per cell (kl.png), the dose-response with survival curves (dose.png), round 5's collapse rates and held-out
curves (confirm.png), the look's runs over the committed ones (look.png), where the levers put the toy
(levers/rows.png), and the levers' grid (levers/grid.png)."""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.regime import design

ARM_COLORS = {"none": "tab:red", "r3": "tab:blue", "r2": "tab:green"}


FIGURES = {  # file: (row key, y label, log scale, title, smoothing window in steps)
    "grid.png": ("eval/accuracy", "held-out accuracy", False,
                 "every run: held-out accuracy (sampled by the engine); dashed and thick: a sustained collapse", 1),
    "kl.png": ("kl", "kl (k3), sampled tokens", True,
               "every run: train-inference kl over training (mean of 25-step windows; axis from 1e-7: the fp32 oracle's "
               "~1e-14 lies below it); dashed and thick: a sustained collapse", 25)}
LOG_YLIM = (1e-7, 3.0)


def _smooth(pts: list, window: int) -> list:
    """Means of `window`-step windows (by step), so a per-step metric reads as a curve."""
    if window <= 1:
        return pts
    out = {}
    for x, y in pts:
        out.setdefault(x // window, []).append(y)
    return [((k + 0.5) * window, sum(v) / len(v)) for k, v in sorted(out.items())]


def grid_figure(cells: dict, rows_by: dict, cal: dict, path: str, name: str = "grid.png") -> None:
    """Rows: the arms (none, r3, then the other cells); columns: the dial positions. Every run is a line (thicker
    when it collapsed by the sustained rule); the title gives the position's measured flips and the count. `name`
    picks the metric (FIGURES)."""
    key, ylabel, log, title, window = FIGURES[name]
    positions = list(design.POSITIONS)
    extra = [c for c in cells if c.split("/")[0] not in positions or c.split("/")[1] == "r2"
             or c.split("/")[2] != "n4"]
    layout = [[f"{p}/{a}/n4" for p in positions] for a in ("none", "r3")]
    layout += [extra[i:i + len(positions)] for i in range(0, len(extra), len(positions))]
    fig, axes = plt.subplots(len(layout), len(positions), figsize=(3.4 * len(positions), 2.6 * len(layout)),
                             sharex=True, sharey=True, squeeze=False)
    for i, row in enumerate(layout):
        for j in range(len(positions)):
            ax = axes[i][j]
            if j >= len(row):
                ax.axis("off")
                continue
            c = row[j]
            e = cells.get(c, dict(collapsed=0, n=0, runs={}))
            color = ARM_COLORS.get(c.split("/")[1], "0.4")
            for s, r in e["runs"].items():
                pts = _smooth([(x["step"], x[key]) for x in rows_by.get((c, s), []) if x.get(key) is not None
                               and (not log or x[key] > 0)], window)
                if pts:
                    fell = r["collapse_step"] is not None
                    ax.plot(*zip(*pts), color=color, lw=1.6 if fell else 0.7, alpha=0.9 if fell else 0.5,
                            ls="-" if not fell else "--")
            setting = design.base_setting(c)
            flips = cal["table"].get(setting, {}).get("start", {}).get("token_flip_rate", {}).get("mean")
            mark = " (paper)" if setting == cal["paper_matched"] else ""
            ax.set_title(f"{c}{mark}\n{'' if flips is None else f'tokens flipped {flips:.0%}, '}"
                         f"{e['collapsed']}/{e['n']} fell", fontsize=8)
            if log:
                ax.set_yscale("log")
                ax.set_ylim(*LOG_YLIM)
            else:
                ax.set_ylim(-0.02, 1.02)
            if j == 0:
                ax.set_ylabel(ylabel)
            if i == len(layout) - 1:
                ax.set_xlabel("step")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def dose_figure(data: dict, cal: dict, path: str) -> None:
    import math
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    paper_x = {"router_flip_rate": design.PAPER["router_flip_rate"], "token_flip_rate": design.PAPER["token_flip_rate"]}
    for ax, quantity in zip(axes[:2], ("router_flip_rate", "token_flip_rate")):
        for arm in ("none", "r3"):
            e = data["dose"].get(f"{quantity}/{arm}")
            if not e:
                continue
            rate = [sum(1 for r in data["cells"].get(f"{p}/{arm}/n4", {}).get("runs", {}).values()
                        if r["collapse_step"] is not None) / max(1, data["cells"].get(f"{p}/{arm}/n4", {}).get("n", 0))
                    for p in design.POSITIONS if data["cells"].get(f"{p}/{arm}/n4", {}).get("n")]
            pos_x = [cal["table"][p]["start"][quantity]["mean"] for p in design.POSITIONS
                     if data["cells"].get(f"{p}/{arm}/n4", {}).get("n")]
            ax.plot(pos_x, rate, "o", color=ARM_COLORS[arm], label=f"{arm}: collapse rate")
            grid = [i / 100 for i in range(0, 101)]
            if e["a"] is not None:  # no fit when every run of the arm agrees
                ax.plot(grid, [1 / (1 + math.exp(-max(-500, min(500, e["a"] + e["b"] * x)))) for x in grid],
                        color=ARM_COLORS[arm], lw=1)
            ax.plot([x for x, _ in e["area"]], [a for _, a in e["area"]], "x", color=ARM_COLORS[arm], alpha=0.4,
                    label=f"{arm}: held-out area, each run")
        ax.axvline(paper_x[quantity], color="0.3", ls=":", lw=1, label="the paper's measured value")
        ax.set_xlabel(f"{quantity.replace('_', ' ')} at the start of RL (regime table)")
        ax.set_ylabel("collapse rate (o) / held-out area (x)")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlim(0, 1)
        ax.legend(fontsize=7)
    ax = axes[2]
    for c, pts in data["survival"].items():
        setting, arm, n = c.split("/")
        if n != "n4" or setting not in design.POSITIONS or arm not in ("none", "r3"):
            continue
        xs, ys = zip(*pts)
        ax.step(xs, ys, where="post", color=ARM_COLORS[arm], alpha=0.3 + 0.7 * list(design.POSITIONS).index(setting)
                / (len(design.POSITIONS) - 1), lw=1, label=c)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction not collapsed")
    ax.set_ylim(-0.03, 1.03)  # fixed, so a flat line at 1 reads as "none fell", not as a zoomed axis
    ax.set_title("survival at 4 mini-steps (darker: stronger dial)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _median_band(ax, runs: dict, colour: str, label: str) -> None:
    """The median over `runs` ({seed: [(step, value)]}, at least one) at each step (thick), and the band between the
    quartiles where there are two runs or more."""
    steps = sorted({s for pts in runs.values() for s, _ in pts})
    at = [[a for pts in runs.values() for s, a in pts if s == st] for st in steps]
    if len(runs) >= 2:
        q = [statistics.quantiles(v, n=4, method="inclusive") if len(v) >= 2 else [v[0]] * 3 for v in at]
        ax.fill_between(steps, [x[0] for x in q], [x[2] for x in q], color=colour, alpha=0.15)
    ax.plot(steps, [statistics.median(v) for v in at], color=colour, lw=2.2, label=label)


def confirm_figure(data: dict, curves: dict, path: str) -> None:
    """Round 5 in one look. Left: the share of runs that collapsed (sustained rule) per method with its Wilson 95 %
    interval, no replay and R3 first. Then one panel per confirmation setting: every run's held-out accuracy (thin),
    the median over seeds at each evaluation (thick) and the band between the 25th and 75th percentiles, no replay
    in red and R3 in blue."""
    from experiments.regime import confirm
    conf, comp = data["confirmation"], data["comparison"]
    bars = []  # (label, rate, lo, hi, colour)
    for r in conf["rows"]:
        for arm in ("none", "r3"):
            n = r[f"n_{arm}"]
            if n:
                lo, hi = r[f"rate_{arm}_ci"]
                bars.append((f"{'no replay' if arm == 'none' else 'R3'}, {r['setting']} (n={n})", r[f"rate_{arm}"],
                             lo, hi, ARM_COLORS[arm]))
    for a, x in comp["arms"].items():
        if a not in ("none", "r3") and x["n"]:
            bars.append((f"{a}, {confirm.COMPARE_SETTING} (n={x['n']})", x["rate"], *x["rate_ci"],
                         "tab:purple" if "r3" in a else "tab:gray"))
    fig, axes = plt.subplots(1, 1 + len(confirm.CONFIRM_SETTINGS), figsize=(6 + 5 * len(confirm.CONFIRM_SETTINGS), 5),
                             gridspec_kw=dict(width_ratios=[1.2] + [1] * len(confirm.CONFIRM_SETTINGS)))
    ax = axes[0]
    for i, (label, rate, lo, hi, colour) in enumerate(bars):
        ax.errorbar(rate, i, xerr=[[max(0.0, rate - lo)], [max(0.0, hi - rate)]], fmt="o", color=colour, capsize=3)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("share of runs that collapsed (95 % Wilson interval)")
    status = "" if conf["complete"] else f" (partial: {conf['runs']} of {conf['total']} runs)"
    ax.set_title(f"collapse rate per method{status}", fontsize=9)
    for ax, setting in zip(axes[1:], confirm.CONFIRM_SETTINGS):
        for arm in ("none", "r3"):
            runs = curves.get(f"{setting}/{arm}/n4", {})
            for pts in runs.values():
                ax.plot(*zip(*pts), color=ARM_COLORS[arm], lw=0.4, alpha=0.35)
            if runs:
                _median_band(ax, runs, ARM_COLORS[arm],
                             f"{'no replay' if arm == 'none' else 'R3'} (median of {len(runs)}; band: quartiles)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out accuracy (sampled by the engine)")
        ax.set_title(f"{setting}: every run thin", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def look_figure(setting: str, committed: dict, here: dict, steps: int, path: str) -> None:
    """The look (look.py): a row per seed, a column per arm. This machine's run (solid, thick) over the committed run
    of the same seed (dashed), every other committed run of the cell thin and grey; a dotted line where the look
    stopped. committed: {arm: {seed: rows}}; here: {(seed, arm): rows}."""
    from experiments.rules import sustained_collapse
    seeds = sorted({s for s, _ in here})
    fig, axes = plt.subplots(len(seeds), 2, figsize=(11, 3.6 * len(seeds)), sharey=True, squeeze=False)
    acc = lambda rows: [(r["step"], r["eval/accuracy"]) for r in rows if r.get("eval/accuracy") is not None]  # noqa
    for i, s in enumerate(seeds):
        for ax, arm in zip(axes[i], ("none", "r3")):
            name = "no replay" if arm == "none" else "R3"
            others = {t: rows for t, rows in committed[arm].items() if t != s}
            for rows in others.values():
                if acc(rows):
                    ax.plot(*zip(*acc(rows)), color="0.6", lw=0.6, alpha=0.6)
            ax.plot([], [], color="0.6", lw=0.6, label=f"other committed seeds ({len(others)})")
            if acc(committed[arm].get(s, [])):
                ax.plot(*zip(*acc(committed[arm][s])), color=ARM_COLORS[arm], ls="--", lw=1.2,
                        label=f"seed {s}, committed ({len(committed[arm][s])} steps)")
            if acc(here.get((s, arm), [])):
                ax.plot(*zip(*acc(here[(s, arm)])), color=ARM_COLORS[arm], lw=2.4, alpha=0.8,
                        label=f"seed {s}, here ({len(here[(s, arm)])} steps)")
            ax.axvline(steps - 0.5, color="0.3", ls=":", lw=1)
            ax.set_ylim(-0.02, 1.02)
            fell = {k: sustained_collapse(rows)[0] for k, rows in (("committed", committed[arm].get(s, [])),
                                                                     ("here", here.get((s, arm), [])))}
            ax.set_title(f"{setting}/{arm}/n4: {name}, seed {s}\n" + "; ".join(
                f"{k} {'held' if x is None else f'fell at step {x}'}" for k, x in fell.items()), fontsize=9)
            ax.set_xlabel("step")
            ax.set_ylabel("held-out accuracy (sampled by the engine)")
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"a look at {setting}: seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} run here "
                 f"for {steps} steps over the committed runs (the rate over all seeds is in the printout)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _err(d: dict) -> list:
    """An error bar from a {mean, lo, hi} summary; none where the interval is missing (fewer than two seeds)."""
    if d.get("lo") is None or d.get("hi") is None:
        return [[0.0], [0.0]]
    return [[d["mean"] - d["lo"]], [d["hi"] - d["mean"]]]


def levers_figure(data: dict, path: str) -> None:
    """Where the levers put the toy (rows.json). Left: tokens with a flipped expert against the train-inference kl
    without replay: the dial's positions at the start of RL (a line, natural to lv3), the low-bit engines at the
    start (t intervals over seeds both ways), the lag over training (K = 0 ... 8, steps 50-190) and the paper's
    Qwen3-30B-A3B figures. Right: the share of that kl left with R3 (kl with R3 / kl), per row, the same rows."""
    from experiments.regime import levers
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw=dict(width_ratios=[1.25, 1]))
    share = []  # (label, kl_r3 / kl, colour)
    line = data.get("dial_line", {})
    if line:
        xs = [v["token_flip_rate"] for v in line.values()]
        ax.plot(xs, [v["kl"] for v in line.values()], "-o", color="tab:gray", ms=5, label="the dial, start of RL")
        for name, v in line.items():
            ax.annotate(name, (v["token_flip_rate"], v["kl"]), textcoords="offset points", xytext=(4, -10), fontsize=7,
                        color="tab:gray")
            share.append((f"dial {name} (start)", v["kl_r3"] / v["kl"], "tab:gray"))
    marks = {"qwen3-ratio": "s", "toy": "^"}
    colours = {"int4": "tab:orange", "fp4": "tab:purple"}
    for row, (preset, dtype) in levers.LOWBIT_ROWS.items():
        s = data["lowbit"][row]["start"]
        t, k = s.get("token_flip_rate"), s.get("kl")
        if not t or not k or t.get("mean") is None or k.get("mean") is None:
            continue
        ax.errorbar(t["mean"], k["mean"], xerr=_err(t), yerr=_err(k), fmt=marks[preset], color=colours[dtype],
                    capsize=2, label=f"{preset}, {dtype} engine (start)")
        if (s.get("kl_r3") or {}).get("mean") is not None:
            share.append((f"{preset} {dtype} (start)", s["kl_r3"]["mean"] / k["mean"], colours[dtype]))
    lag = [(name, v) for name, v in data["lag"].items() if name != "lv3" and v.get("n")]
    if lag:
        ax.plot([v["token_flip_rate"]["mean"] for _, v in lag], [v["kl"]["mean"] for _, v in lag], "-D",
                color="tab:green", ms=5, label="rollout lag K (steps 50-190)")
        for name, v in lag:
            ax.annotate(f"K={name[3:]}", (v["token_flip_rate"]["mean"], v["kl"]["mean"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7, color="tab:green")
            if (v.get("probe_kl") or {}).get("mean") and (v.get("probe_kl_r3") or {}).get("mean") is not None:
                share.append((f"lag K={name[3:]} (probe, step 200)", v["probe_kl_r3"]["mean"] / v["probe_kl"]["mean"],
                              "tab:green"))
    p = data["paper"]
    ax.plot(p["token_flip_rate"], p["kl"], "*", color="black", ms=14, label="paper, Qwen3-30B-A3B")
    share.append(("paper, Qwen3-30B-A3B", p["kl_r3"] / p["kl"], "black"))
    ax.set_yscale("log")
    ax.set_xlim(0, 1)
    ax.set_xlabel("tokens with at least one flipped expert (engine vs trainer)")
    ax.set_ylabel("train-inference kl (k3), no replay")
    status = "" if data.get("complete") else " (partial)"
    ax.set_title(f"where each lever puts the toy (means over seeds 0-7){status}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    for i, (label, v, colour) in enumerate(share):
        bx.barh(i, v, color=colour, alpha=0.8)
        bx.annotate(f"{v:.2f}", (v, i), textcoords="offset points", xytext=(3, -3), fontsize=7)
    bx.set_yticks(range(len(share)), [s[0] for s in share], fontsize=7)
    bx.invert_yaxis()
    bx.set_xlim(0, 1.1)
    bx.axvline(1.0, color="black", lw=0.5)
    bx.set_xlabel("kl left with R3 (kl with R3 / kl without)")
    bx.set_title("what R3 removes: a short bar is a large cut", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


LEVER_ARM_COLORS = {**ARM_COLORS, "tis": "tab:orange", "r3-tis": "tab:purple"}


def levers_grid_figure(data: dict, curves: dict, path: str) -> None:
    """The levers' grid (levers_run.write_grid's data) in one look. Left: the share of runs that collapsed (sustained
    rule) per cell with its Wilson 95 % interval, grouped by setting. Then one panel per setting: each arm's held-out
    accuracy, the median over seeds at each evaluation and the band between the quartiles (curves: {cell: {seed:
    [(step, accuracy)]}})."""
    from experiments.stats import wilson
    settings = list(dict.fromkeys(c.split("/")[0] for c in data["cells"]))
    fig, axes = plt.subplots(1, 1 + max(1, len(settings)), figsize=(6 + 4.5 * max(1, len(settings)), 5),
                             gridspec_kw=dict(width_ratios=[1.3] + [1] * max(1, len(settings))))
    ax, labels = axes[0], []
    for i, (c, e) in enumerate(data["cells"].items()):
        lo, hi = wilson(e["collapsed"], e["n"])
        rate = e["collapsed"] / e["n"] if e["n"] else 0.0
        ax.errorbar(rate, i, xerr=[[max(0.0, rate - lo)], [max(0.0, hi - rate)]], fmt="o", capsize=3,
                    color=LEVER_ARM_COLORS.get(c.split("/")[1], "0.4"))
        labels.append(f"{c} ({e['collapsed']} of {e['n']})")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("share of runs that collapsed (95 % Wilson interval)")
    status = "" if data["complete"] else f" (partial: {data['runs']} of {data['planned']} runs)"
    ax.set_title(f"collapse rate per cell{status}", fontsize=9)
    for ax, setting in zip(axes[1:], settings):
        for c in (c for c in data["cells"] if c.split("/")[0] == setting):
            arm = c.split("/")[1]
            if curves.get(c):
                _median_band(ax, curves[c], LEVER_ARM_COLORS.get(arm, "0.4"), f"{arm} (median of {len(curves[c])})")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("step")
        ax.set_ylabel("held-out accuracy (sampled by the engine)")
        ax.set_title(f"{setting}: band between the quartiles", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
