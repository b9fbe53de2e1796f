"""Figures: one run's health panels, several runs overlaid, and the mismatch inspector's PNG.

  plot_run(records, path, title)          one run's metrics.jsonl, one panel per health signal (train.py, at the end)
  compare_runs(run_dirs, out_png)         runs overlaid: reward, held-out accuracy, kl, F(2), flips, grad norm; the
                                          legend names the flags that differ between the runs' args.json
  plot_inspection(data, path, title)      |log r| on flipped vs unflipped tokens, without and with R3
                                          (r3/tools/inspect.py)
  python -m r3.plots RUN_A RUN_B ... [--out compare.png]

matplotlib is imported inside each function (Agg backend), so importing this module costs nothing.
`tensorboard_writer` mirrors metrics records to TensorBoard when the `tensorboard` package is installed.
"""
import argparse
import json
import math
import os

from r3.errors import MissingInputError, run_main
from r3.runs.ema import EMA_DECAY, ema_series
from r3.runs.io import read_jsonl

PANELS = [("reward", "reward", False), ("kl", "mismatch kl (k3)", True), ("extreme_frac", "F(2)", False),
          (("router_flip_rate", "token_flip_rate"), "flip rates", False), ("grad_norm", "grad norm (pre-clip)", True),
          ("response_length", "response length", False), ("entropy", "entropy", False),
          (("eval/accuracy", "eval/accuracy_greedy"), "held-out accuracy (exact)", False)]
COMPARE = [("reward", "reward (EMA 0.9; raw faint)", False), ("eval/accuracy", "held-out accuracy (sampled; "
           "greedy dashed)", False), ("kl", "mismatch kl (k3)", True), ("extreme_frac", "F(2)", False),
           ("router_flip_rate", "router flip rate", False), ("grad_norm", "grad norm (pre-clip)", True)]
NOT_FLAGS = {"out", "resume", "overwrite", "quiet", "no_plot", "warmup_checkpoint", "r3", "threads", "tensorboard"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that carry a non-None `key`."""
    pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return ([s for s, _ in pts], [v for _, v in pts]) if pts else ([], [])


def plot_run(records: list[dict], path: str, title: str = "") -> None:
    plt = _plt()
    fig, axes = plt.subplots(3, 3, figsize=(15, 9))
    for ax, (keys, label, log) in zip(axes.flat, PANELS):
        plotted = False
        for k in (keys if isinstance(keys, tuple) else (keys,)):
            xs, ys = series(records, k)
            if xs:
                ax.plot(xs, ys, "o-" if k.startswith("eval/") else "-", ms=3, lw=1, label=k)
                plotted = True
        if not plotted:
            ax.text(0.5, 0.5, "n/a", ha="center", transform=ax.transAxes)
        if keys == "reward" and plotted:  # the collapse guard watches this running mean
            xs, ys = series(records, "reward")
            ax.plot(xs, ema_series(ys), lw=1.5, label=f"EMA {EMA_DECAY}")
        if (isinstance(keys, tuple) or keys == "reward") and plotted:
            ax.legend(fontsize=7)
        ax.set_title(label, fontsize=9)
        if log and plotted:
            ax.set_yscale("log")
        ax.set_xlabel("step", fontsize=8)
    ax = axes.flat[-1]
    xs, ys = series(records, "val/kl")
    if xs:
        ax.plot(xs, ys, "o-", ms=3, lw=1)
        ax.set_yscale("log")
    ax.set_title("val/kl (normal vs replayed train forward)", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def differing_flags(arg_dicts: list[dict]) -> list[str]:
    """Flags whose values differ between runs (bookkeeping flags such as --out left out), in args.json order."""
    keys = [k for d in arg_dicts for k in d if k not in NOT_FLAGS]
    keys = list(dict.fromkeys(keys))
    return [k for k in keys if len({json.dumps(d.get(k), sort_keys=True) for d in arg_dicts}) > 1]


def run_labels(run_dirs: list[str]) -> list[str]:
    """Legend labels: the differing flags as `--flag value`, else the folder name."""
    args = []
    for d in run_dirs:
        p = os.path.join(d, "args.json")
        if os.path.exists(p):
            with open(p) as f:
                args.append(json.load(f))
        else:
            args.append({})
    flags = differing_flags(args) if all(args) else []
    if not flags:
        return [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    return [" ".join(f"--{k.replace('_', '-')} {a.get(k)}" for k in flags) for a in args]


def compare_runs(run_dirs: list[str], out_png: str, *, title: str = "", labels: list[str] | None = None) -> str:
    """Overlay the runs' metrics.jsonl in one PNG (see COMPARE); returns out_png."""
    plt = _plt()
    labels = labels or run_labels(run_dirs)
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    colours = plt.get_cmap("tab10" if len(run_dirs) <= 10 else "tab20").colors
    for i, (d, label) in enumerate(zip(run_dirs, labels)):
        recs, c = read_jsonl(os.path.join(d, "metrics.jsonl")), colours[i % len(colours)]
        if not recs:
            raise MissingInputError(f"{d}: no metrics.jsonl (or it is empty)")
        for ax, (key, _, _) in zip(axes.flat, COMPARE):
            xs, ys = series(recs, key)
            if key == "reward" and xs:
                ax.plot(xs, ys, color=c, lw=0.6, alpha=0.3)
                ys = ema_series(ys)
            ax.plot(xs, ys, "o-" if key.startswith("eval/") else "-", ms=3, lw=1.3, color=c, label=label)
            if key == "eval/accuracy":
                ax.plot(*series(recs, "eval/accuracy_greedy"), "s--", ms=3, lw=1, color=c)
    for ax, (key, name, log) in zip(axes.flat, COMPARE):
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        if not any(line.get_xydata().size for line in ax.lines):
            ax.text(0.5, 0.5, f"no run logged {key}", ha="center", transform=ax.transAxes, fontsize=9)
        elif log:
            ax.set_yscale("log")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title or " vs ".join(os.path.basename(os.path.normpath(d)) for d in run_dirs)[:150], fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def plot_inspection(data: dict, path: str, title: str = "") -> None:
    """data (r3/tools/inspect.py): abs_log_r {normal, r3: per-token lists}, flips (flipped layers per token),
    layer_flip_rate, examples ((prompt, tokens) of r3.tools.inspect.row_tokens), summary."""
    plt = _plt()
    import numpy as np
    fig = plt.figure(figsize=(14, 8.5))
    grid = fig.add_gridspec(2, 3, height_ratios=[1, 0.8])
    flips = np.array(data["flips"])
    floor = 1e-7  # |log r| is shown on a log axis; exact zeros sit on the floor
    ax = fig.add_subplot(grid[0, 0])
    groups, names = [], []
    for arm, label in (("normal", "no replay"), ("r3", "R3")):
        x = np.maximum(np.array(data["abs_log_r"][arm]), floor)
        for sel, kind in ((flips == 0, "unflipped"), (flips > 0, "flipped")):
            groups.append(x[sel])
            names.append(f"{label}\n{kind}\n(n={int(sel.sum())})")
    ax.boxplot([g if g.size else [np.nan] for g in groups], whis=(5, 95), showfliers=False)
    rng = np.random.default_rng(0)
    for i, g in enumerate(groups):
        ax.scatter(i + 1 + rng.uniform(-0.25, 0.25, g.size), g, s=3, alpha=0.25, color="C3" if i % 2 else "C0")
        if g.size:
            ax.plot(i + 1, g.mean(), "k^", ms=6)
    ax.axhline(math.log(2), color="gray", ls=":", lw=1)
    ax.set_xticks(range(1, 5), names, fontsize=8)
    ax.set_yscale("log")
    ax.set_title("|log r| per response token (▲ mean, dotted: log 2)", fontsize=9)
    ax = fig.add_subplot(grid[0, 1])
    ks = sorted(set(flips.tolist()))
    for arm, label, c in (("normal", "no replay", "C3"), ("r3", "R3", "C2")):
        x = np.array(data["abs_log_r"][arm])
        ax.plot(ks, [max(x[flips == k].mean(), floor) for k in ks], "o-", color=c, label=label)
    ax.set_xticks(ks, [f"{k}\n(n={int((flips == k).sum())})" for k in ks], fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("MoE layers whose top-k the trainer flips", fontsize=8)
    ax.set_title("mean |log r| by number of flipped layers", fontsize=9)
    ax.legend(fontsize=8)
    ax = fig.add_subplot(grid[0, 2])
    rates = data["layer_flip_rate"]
    ax.bar(range(len(rates)), rates, color="C3")
    ax.set_xticks(range(len(rates)), [f"L{i}" for i in range(len(rates))])
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.1%}")
    ax.set_title("router flip rate per layer (the trainer's own top-k vs the engine's)", fontsize=9)
    _draw_examples(fig.add_subplot(grid[1, :]), data["examples"])
    s = data["summary"]
    n, r = s["normal"], s["r3"]
    fig.suptitle(f"{title[:150]}\nmean |log r| on flipped tokens {n['flipped']['mean_abs_log_r']:.3g} → "
                 f"{r['flipped']['mean_abs_log_r']:.3g} with R3, on unflipped "
                 f"{n['unflipped']['mean_abs_log_r']:.3g} → "
                 f"{r['unflipped']['mean_abs_log_r']:.3g};  F(2) {n['extreme_frac']:.2%} → {r['extreme_frac']:.2%};  "
                 f"kl {n['kl']:.2e} → {r['kl']:.2e};  {s['token_flip_rate']:.1%} of {s['tokens']} tokens flipped",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_r_rgb(x: float) -> tuple[float, float, float]:
    """Diverging colour of a log-ratio on a log scale of |x|: white up to 1e-2, full at >= 1; red: x < 0 (the trainer
    gives the token less probability than the engine), blue: x > 0. Shared by the PNG and the HTML page."""
    t = min(1.0, max(0.0, (math.log10(abs(x)) + 2) / 2)) if x else 0.0
    lo = 1 - 0.8 * t
    return (1.0, lo, lo) if x < 0 else (lo, lo, 1.0)


def _draw_examples(ax, examples: list[tuple[list[str], list[dict]]]) -> None:
    """Each example (prompt, response tokens) twice, no replay then R3: response tokens coloured by log r; flipped
    layers boxed and listed under the no-replay line."""
    ax.set_axis_off()
    n = max(1, len(examples))
    width = max([len(p) + len(toks) + 1 for p, toks in examples] + [20])
    dy = 1 / (3 * n + 0.5)
    for i, (prompt, toks) in enumerate(examples):
        for j, (key, label) in enumerate((("log_r", "no replay"), ("log_r_r3", "R3"))):
            y = 1 - (3 * i + j + 0.7) * dy
            ax.text(0, y, label, fontsize=8, va="center", transform=ax.transAxes)
            cells = [(t, None) for t in prompt] + [("|", None)] + [(t["tok"], t) for t in toks]
            for k, (text, t) in enumerate(cells):
                x = 0.08 + 0.92 * k / width
                box = None if t is None else dict(boxstyle="round,pad=0.25", fc=log_r_rgb(t[key]),
                                                  ec="#b00" if t.get("layers") and j == 0 else "none", lw=1.5)
                ax.text(x, y, text, fontsize=8, family="monospace", va="center", transform=ax.transAxes,
                        color="#888" if t is None else "k", bbox=box)
                if j == 0 and t is not None and t.get("layers"):
                    ax.text(x, y - 0.5 * dy, "L" + ",".join(map(str, t["layers"])), fontsize=7, color="#b00",
                            va="center", transform=ax.transAxes)
    ax.set_title("example rows (grey: prompt): response tokens coloured by log r (red: trainer < engine, blue: >; "
                 "white below 1e-2, full at 1); red box and L…: MoE layers whose top-k the trainer flips",
                 fontsize=9)


def tensorboard_writer(log_dir: str):
    """A `SummaryWriter` for the metrics records (`log_scalars`); a clear error when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise RuntimeError(f"--tensorboard needs the tensorboard package (pip install tensorboard): {e}") from e
    return SummaryWriter(log_dir)


def log_scalars(writer, record: dict) -> None:
    """Every finite number of a metrics.jsonl record, at its step."""
    for k, v in record.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            writer.add_scalar(k, v, record["step"])


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description="Overlay runs: reward, held-out accuracy, kl, F(2), flips, grad norm")
    p.add_argument("runs", nargs="+", help="run folders (each with metrics.jsonl and args.json)")
    p.add_argument("--out", default="compare.png", help="output PNG")
    p.add_argument("--title", default="", help="figure title (default: the run folder names)")
    args = p.parse_args(argv)
    out = compare_runs(args.runs, args.out, title=args.title)
    print(f"wrote {out}  ({'; '.join(run_labels(args.runs))})")
    return out


if __name__ == "__main__":
    run_main(main)
