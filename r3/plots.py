"""Plots for a run's metrics.jsonl (one PNG, one panel per health signal)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [("reward", "reward", False), ("kl", "mismatch kl (k3)", True), ("extreme_frac", "F(2)", False),
          (("router_flip_rate", "token_flip_rate"), "flip rates", False), ("grad_norm", "grad norm (pre-clip)", True),
          ("response_length", "response length", False), ("entropy", "entropy", False)]


def read_metrics(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_run(records: list[dict], path: str, title: str = "") -> None:
    fig, axes = plt.subplots(2, 4, figsize=(16, 6.5))
    steps = [r["step"] for r in records]
    for ax, (keys, label, log) in zip(axes.flat, PANELS):
        for k in (keys if isinstance(keys, tuple) else (keys,)):
            ys = [r.get(k) for r in records]
            if all(y is None for y in ys):
                ax.text(0.5, 0.5, "n/a (dense)", ha="center", transform=ax.transAxes)
                continue
            ax.plot(steps, [float("nan") if y is None else y for y in ys], label=k, lw=1)
        if keys == "reward":  # the collapse guard watches this running mean
            ema, smooth = None, []
            for r in records:
                ema = r["reward"] if ema is None else 0.9 * ema + 0.1 * r["reward"]
                smooth.append(ema)
            ax.plot(steps, smooth, lw=1.5, label="EMA 0.9")
            ax.legend(fontsize=7)
        if isinstance(keys, tuple):
            ax.legend(fontsize=7)
        ax.set_title(label, fontsize=9)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("step", fontsize=8)
    val = [(r["step"], r["val/kl"]) for r in records if r.get("val/kl") is not None]
    ax = axes.flat[-1]
    if val:
        ax.plot(*zip(*val), "o-", ms=3, lw=1)
        ax.set_yscale("log")
    ax.set_title("val/kl (normal vs replayed train forward)", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
