"""The paper's train/inference mismatch table (arXiv 2510.11370), at toy scale: dense vs MoE vs MoE + R3.

For each preset and rollout precision, both the MoE model and its dense twin (same SFT warm-up recipe) generate
`--prompts` × `--samples` responses with the rollout engine; the fp32 trainer then re-scores every batch:
  dense       dense twin, normal forward
  MoE         MoE, the trainer's own routing
  MoE + R3    MoE, replaying the engine's recorded routes (same batch as the MoE row)
Columns (over response tokens, `r3.train.metrics`): kl (k3, ×1e-3) ± its standard error over 8 chunks of prompts,
kl_full (×1e-3), extreme_frac F(2), and for MoE rows the router flips of the trainer's *own* routing vs the rollout
routes (identical in the MoE and MoE + R3 rows: same batch; R3 then overrides them, so the R3 forward itself has 0),
and kl split into tokens where that routing flipped ≥ 1 layer vs tokens where it flipped none.
The paper's Qwen3-30B-A3B numbers (48 MoE layers, SGLang vs Megatron) sit below ours: compare the pattern
(MoE ≫ dense, MoE + R3 ≈ dense), not the values; flips_per_token scales with the number of layers.

Writes markdown to stdout, OUT/mismatch_table.json and OUT/mismatch_table.png (kl per precision, log scale).
  python -m experiments.mismatch                     # toy, bf16 fp16 fp8, 512 prompts × 8, 200 warm-up steps
The MoE warm-up is bit-reproducible only at a fixed thread count (--threads, default 1; the dense one is not
sensitive): a different count gives a slightly different MoE, and its kl moves by about the printed s.e. or more.
"""
import argparse
import os
import time

import torch

from experiments.common import fmt, markdown_table, write_results
from experiments.mismatch_rows import DEFAULTS, N_CHUNKS, PAPER, ROWS, measure
from r3.rollout.engine import ROLLOUT_DTYPES
from r3.model.model import PRESETS
from r3.tasks.tasks import make_task
from r3.train.warmup import load_model

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--presets", nargs="+", default=["toy"], choices=sorted(PRESETS), help="model presets")
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp16", "fp8"], choices=sorted(ROLLOUT_DTYPES),
                   help="rollout precisions, one table each (the trainer is always fp32)")
    p.add_argument("--task", default=DEFAULTS["task"], help="toy task used for the warm-up and the prompts")
    p.add_argument("--prompts", type=int, default=DEFAULTS["prompts"], help="prompts per (preset, precision)")
    p.add_argument("--samples", type=int, default=DEFAULTS["samples"], help="samples per prompt")
    p.add_argument("--temperature", type=float, default=DEFAULTS["temperature"], help="sampling temperature")
    p.add_argument("--warmup-steps", type=int, default=DEFAULTS["warmup_steps"],
                   help="SFT warm-up steps, the same for MoE and dense")
    p.add_argument("--seed", type=int, default=0, help="init / warm-up seed and prompt / sampling seed")
    p.add_argument("--cache-dir", default=".cache/warmup", help="warm-up checkpoint cache")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (toy matmuls are too small for more)")
    p.add_argument("--out", default="results", help="folder for mismatch_table.json and mismatch_table.png")
    return p.parse_args(argv)


def table(rows: list[dict], dtype: str) -> str:
    dense_kl = next(r["kl"] for r in rows if r["row"] == "dense")
    header = ["row", "kl ×1e-3", "kl / dense", "kl_full ×1e-3", "extreme_frac", "router_flip_rate",
              "token_flip_rate", "flips_per_token", "kl ×1e-3 flipped / unflipped tokens", "tokens", "reward"]
    body = []
    for r in rows:
        body.append([r["row"], f"{fmt(r['kl'], 1e3)} ± {fmt(r['kl_se'], 1e3, 2)}", fmt(r["kl"] / dense_kl),
                     fmt(r["kl_full"], 1e3), fmt(r["extreme_frac"]), fmt(r["router_flip_rate"]),
                     fmt(r["token_flip_rate"]), fmt(r["flips_per_token"]),
                     "—" if r["kl_flipped"] is None
                     else f"{fmt(r['kl_flipped'], 1e3)} / {fmt(r['kl_unflipped'], 1e3)}",
                     str(r["n_tokens"]),
                     fmt(r["reward_mean"])])
    for name in ROWS:
        p = PAPER[name]
        body.append([f"*paper: {name}*", fmt(p["kl"], 1e3), fmt(p["kl"] / PAPER["dense"]["kl"]), "—", "—",
                     fmt(p.get("router_flip_rate")), fmt(p.get("token_flip_rate")), fmt(p.get("flips_per_token")),
                     "—", "—", "—"])
    return f"rollout {dtype} vs fp32 trainer\n\n" + markdown_table(header, body)


def plot(results: list[dict], presets: list[str], dtypes: list[str], warmup_steps: int, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(presets), figsize=((2.5 + 1.6 * len(dtypes)) * len(presets), 3.8), squeeze=False)
    width, colors = 0.26, dict(zip(ROWS, ("tab:gray", "tab:red", "tab:blue")))
    for ax, preset in zip(axes[0], presets):
        for j, name in enumerate(ROWS):
            rs = [next(r for r in results if (r["preset"], r["dtype"], r["row"]) == (preset, d, name)) for d in dtypes]
            xs = [i + (j - 1) * width for i in range(len(dtypes))]
            ax.bar(xs, [r["kl"] for r in rs], width, yerr=[r["kl_se"] for r in rs], label=name, color=colors[name],
                   capsize=2)
            ax.bar(len(dtypes) + (j - 1) * width, PAPER[name]["kl"], width, color=colors[name], hatch="//",
                   edgecolor="white")
        ax.set_xticks(range(len(dtypes) + 1), dtypes + ["paper\n30B-A3B"])
        ax.set_xlabel("rollout precision (paper: hatched)")
        ax.set_yscale("log")
        ax.set_ylabel("train-inference kl (k3), ± s.e.")
        ax.set_title(f"{preset}, {warmup_steps} SFT warm-up steps; trainer fp32", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    task = make_task(args.task)
    results, models_desc, out_md = [], {}, []
    for preset in args.presets:
        models = {}
        for kind in ("moe", "dense"):
            models[kind], models_desc[f"{preset}/{kind}"] = load_model(
                preset, dense=kind == "dense", task=task, task_spec=args.task, warmup_steps=args.warmup_steps,
                init_seed=args.seed, cache_dir=args.cache_dir, progress=False)
        for dtype in args.dtypes:
            rows = measure(preset, dtype, models, task, args)
            results += rows
            out_md.append(f"### {preset}, " + table(rows, dtype))
    wall = time.time() - t0
    header = (f"Models: {'; '.join(f'{k}: {v}' for k, v in models_desc.items())}.\n"
              f"{args.prompts} prompts × {args.samples} samples per (model, precision), task {args.task}, "
              f"temperature {args.temperature}, seed {args.seed}. kl ± standard error over {N_CHUNKS} prompt chunks. "
              f"Flip columns: trainer's own routing vs rollout routes (the R3 forward replays them: 0 flips).")
    print(header + "\n\n" + "\n\n".join(out_md) + f"\n\nwall time {wall:.1f}s")
    os.makedirs(args.out, exist_ok=True)
    report = dict(args=vars(args), models=models_desc, wall_s=round(wall, 1), paper=PAPER, results=results)
    write_results(os.path.join(args.out, "mismatch_table.json"), report, t0=t0)
    plot(results, args.presets, args.dtypes, args.warmup_steps, os.path.join(args.out, "mismatch_table.png"))
    return report

