"""Where each seed starts: the headline's supervised warm-up, scored per seed and per warm-up length.

  python -m experiments.staleness.starts    # results/starts.{json,md,png}: seeds 0-7 x 80, 160, 320 warm-up steps
                                            # (18 min on one shared core with the warm-ups to build; a minute cached)

Exploratory. The staleness grid's seeds 3 and 4 hardly learned at N >= 4 mini-steps where seeds 0-2 reached the top, and
their first RL step's reward was lower (grid.json's `start`); the grid's plateaus are runs stuck on one to four cipher
symbols (experiments.staleness.plateaus). Both could come from where the warm-up leaves a seed. This scores every
warm-up checkpoint the headline would start from (`--preset toy --task cipher:32-32`, the seed as init seed, the same
cache as train.py) on the 128 held-out prompts the grid evaluates on:

- `sampled_reward`: the mean reward (share of symbols right) of 8 samples per prompt at temperature 1 from the fp32
  engine, the level the first RL step sees; `sampled_exact`: the share of those samples wholly right (the grid's
  held-out accuracy); `greedy_reward` and `greedy_exact` for the greedy answer;
- per symbol (the 64 cipher symbols), the teacher-forced probability of its right image, averaged over its
  occurrences in the held-out answers (`symbol_p`, `rank`: 1 = the weakest; `mean_symbol_p`; `weak`: those below
  0.5).

With `--grid` (default results/staleness, read when it is there; a folder named with --grid must exist) it sets each
seed's 80-step row beside the grid's measured start and its best held-out at N = 4 and 8, and the symbols its grid
runs got stuck on (`plateaus.json`) beside their probability after the warm-up and their rank among the 64 (1 = the
weakest). It decides nothing: no rule was written before it ran, and it does not touch the grid's."""
import argparse
import json
import os
import statistics
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from experiments.common import fmt, write_results  # noqa: E402
from r3.rollout.engine import Engine  # noqa: E402
from r3.errors import InputError, run_main  # noqa: E402
from r3.train.evaluate import evaluate, heldout_examples  # noqa: E402
from r3.runs.io import read_json_object  # noqa: E402
from r3.tasks.tasks import EOS, PAD, SYMBOL0, make_task  # noqa: E402
from r3.train.warmup import preset_config, warmed_up_model  # noqa: E402

TASK = "cipher:32-32"  # the headline's task and preset (experiments.sweep HEADLINE)
PRESET = "toy"
EVAL_PROMPTS = 128     # the grid's --eval-prompts: the same held-out prompts
SAMPLES = 8            # the grid's --group-size
GRID = "results/staleness"
WEAK = 0.5             # a symbol whose right image has less teacher-forced probability than this is weak


@torch.no_grad()
def per_symbol(model, examples) -> dict[int, float]:
    """Mean teacher-forced probability of each symbol's right image over its occurrences in the answers."""
    tokens = torch.tensor([e.prompt + e.answer for e in examples])
    P = len(examples[0].prompt)
    logits, _ = model(tokens[:, :-1])
    logp = torch.log_softmax(logits.float(), -1)  # position t predicts token t + 1
    answer = tokens[:, P:]
    p = logp[:, P - 1:].gather(-1, answer.unsqueeze(-1)).squeeze(-1).exp()
    src = tokens[:, :P - 1] - SYMBOL0  # cipher: answer i is the image of prompt symbol i
    sums, counts = torch.zeros(64, dtype=torch.float64), torch.zeros(64, dtype=torch.float64)
    sums.index_add_(0, src.flatten(), p.flatten().double())
    counts.index_add_(0, src.flatten(), torch.ones(src.numel(), dtype=torch.float64))
    return {s: float(sums[s] / counts[s]) for s in range(64) if counts[s] > 0}


def score(seed: int, steps: int, cache_dir: str, task, examples: list) -> dict:
    """One warm-up checkpoint (seed, steps) scored on `examples`, the task's held-out prompts."""
    model, _ = warmed_up_model(preset_config(PRESET, task), task, TASK, steps=steps, seed=seed, cache_dir=cache_dir,
                               progress=False)
    model = model.float().eval()
    m = evaluate(Engine(model, "fp32"), task, examples, max_new_tokens=task.max_new_tokens, eos_ids=(EOS,),
                 pad_id=PAD, samples=SAMPLES)
    probs = per_symbol(model, examples)
    ranked = sorted(probs, key=lambda s: (probs[s], s))
    return dict(seed=seed, warmup_steps=steps, sampled_reward=m["eval/reward"], sampled_exact=m["eval/accuracy"],
                greedy_reward=m["eval/reward_greedy"],
                greedy_exact=m["eval/accuracy_greedy"], mean_symbol_p=statistics.fmean(probs.values()),
                weak=[s for s in ranked if probs[s] < WEAK], symbol_p={str(s): probs[s] for s in sorted(probs)},
                rank={str(s): i + 1 for i, s in enumerate(ranked)})


def grid_view(grid: str) -> dict:
    """Per seed, from GRID/grid.json and GRID/plateaus.json when they exist: the measured start, the best held-out at
    N = 4 and 8, and the symbols its runs got stuck on (run names per symbol)."""
    out = {}
    path = os.path.join(grid, "grid.json")
    if os.path.exists(path):
        g = read_json_object(path)
        try:  # a grid.json made before the start rule has no "start": nothing to set beside
            for r in g.get("start", {}).get("seeds", []):
                out.setdefault(int(r["seed"]), {}).update(start=r["start"], best_n4_n8=r["best_n4_n8"],
                                                          n4_n8_runs=r["n4_n8_runs"])
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise InputError(f"{path}: not an experiments.staleness grid.json ({type(e).__name__}: {e})") from None
    path = os.path.join(grid, "plateaus.json")
    if os.path.exists(path):
        runs = read_json_object(path).get("runs")
        try:
            for r in runs:
                seed = int(r["run"].rsplit("-s", 1)[1])
                for sym in r["stuck"]:
                    out.setdefault(seed, {}).setdefault("stuck", {}).setdefault(str(sym), []).append(r["run"])
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise InputError(f"{path}: not an experiments.staleness.plateaus result ({type(e).__name__}: {e})") \
                from None
    return out


def tables(rows: list[dict], view: dict, steps: list[int]) -> str:
    by = {(r["seed"], r["warmup_steps"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    head = ["| seed |"] + [f" sampled reward after {w} |" for w in steps] + \
           [f" mean p of a symbol's right image after {w} |" for w in steps]
    lines = ["".join(head), "|---" * (1 + 2 * len(steps)) + "|"]
    for s in seeds:
        lines.append(f"| {s} | " + " | ".join(fmt(by[s, w]["sampled_reward"]) if (s, w) in by else "—" for w in steps)
                     + " | " + " | ".join(fmt(by[s, w]["mean_symbol_p"]) if (s, w) in by else "—" for w in steps)
                     + " |")
    def spread(key):
        return "; ".join(f"{w} steps: {fmt(min(v))}-{fmt(max(v))}" for w in steps
                         if (v := [by[s, w][key] for s in seeds if (s, w) in by]))
    out = "\n".join(lines) + "\n\nAcross seeds (min-max), sampled reward: " + spread("sampled_reward") + \
        ". Sampled exact answers (the grid's held-out accuracy): " + spread("sampled_exact") + "."
    w0 = steps[0]
    if view:
        lines = [f"| seed | sampled reward after {w0} | greedy exact after {w0} | grid start (first-step reward) | "
                 f"grid best held-out at N = 4, 8 (runs) | symbols stuck in its grid runs: p after {w0} (rank of 64, "
                 f"runs) |", "|---|---|---|---|---|---|"]
        for s in seeds:
            r, v = by.get((s, w0)), view.get(s, {})
            if r is None:
                continue
            stuck = ", ".join(f"{sym}: {fmt(r['symbol_p'][sym])} ({r['rank'][sym]}, {len(runs)})"
                              for sym, runs in sorted(v.get("stuck", {}).items(), key=lambda kv: -len(kv[1])))
            lines.append(f"| {s} | {fmt(r['sampled_reward'])} | {fmt(r['greedy_exact'])} | {fmt(v.get('start'))} | "
                         f"{fmt(v.get('best_n4_n8'))} ({v.get('n4_n8_runs', 0)}) | {stuck or '—'} |")
        out += f"\n\nBeside the grid (its grid.json and plateaus.json; seeds it has not run show —):\n\n" + \
               "\n".join(lines)
    return out


def plot(rows: list[dict], view: dict, steps: list[int], path: str) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for s in sorted({r["seed"] for r in rows}):
        pts = sorted((r["warmup_steps"], r["sampled_reward"]) for r in rows if r["seed"] == s)
        a.plot(*zip(*pts), marker="o", label=f"seed {s}")
    a.set(xlabel="warm-up steps", ylabel="sampled reward on the held-out prompts", title="where each seed starts")
    a.legend(fontsize=7)
    pts = [(r["sampled_reward"], view[r["seed"]]["best_n4_n8"], r["seed"]) for r in rows
           if r["warmup_steps"] == steps[0] and view.get(r["seed"], {}).get("best_n4_n8") is not None]
    for x, y, s in pts:
        b.scatter(x, y, color="C0")
        b.annotate(str(s), (x, y), textcoords="offset points", xytext=(4, 4))
    b.set(xlabel=f"sampled reward after {steps[0]} warm-up steps", ylabel="grid: best held-out at N = 4, 8",
          title="start against climb (grid seeds)", ylim=(-0.05, 1.05))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    p.add_argument("--warmup-steps", type=int, nargs="+", default=[80, 160, 320],
                   help="warm-up lengths to score; the first is the one set beside the grid (the headline's 80)")
    p.add_argument("--grid", default=None,
                   help=f"a staleness grid's folder (default {GRID}, read when it exists)")
    p.add_argument("--cache-dir", default=".cache/warmup", help="the warm-up cache (train.py's default)")
    p.add_argument("--out", default="results")
    args = p.parse_args(argv)
    if min(args.warmup_steps) < 1:
        p.error("--warmup-steps must be >= 1 (a start from random init is not a warm-up)")
    if min(args.seeds) < 0:
        p.error("--seeds must be >= 0")
    if args.grid is not None and not os.path.isdir(args.grid):
        p.error(f"--grid {args.grid}: no such folder")
    return args


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    torch.set_num_threads(1)  # the warm-up is built on one thread; score on one too, as the grid's runs do
    grid = args.grid or GRID
    view = grid_view(grid) if os.path.isdir(grid) else {}  # read first: a bad file fails before the warm-ups
    jobs = [(s, w) for w in args.warmup_steps for s in args.seeds]
    task = make_task(TASK)
    examples = heldout_examples(task, EVAL_PROMPTS)  # the same for every checkpoint
    if len({len(e.prompt) for e in examples}) != 1:
        raise InputError(f"{TASK}: held-out prompts of more than one length; per_symbol needs one")
    rows = [score(s, w, args.cache_dir, task, examples) for s, w in tqdm(jobs, desc="warm-ups", unit="ckpt")]
    md = ("Exploratory: each seed's warm-up checkpoint (`--preset toy --task cipher:32-32`), scored on the grid's 128 "
          f"held-out prompts: the mean reward of {SAMPLES} samples per prompt (fp32 engine, temperature 1) and the "
          f"count of weak symbols (teacher-forced probability of the right image below {WEAK}).\n\n" +
          tables(rows, view, args.warmup_steps))
    print(md)
    os.makedirs(args.out, exist_ok=True)
    plot(rows, view, args.warmup_steps, os.path.join(args.out, "starts.png"))
    write_results(os.path.join(args.out, "starts.json"),
                  dict(task=TASK, preset=PRESET, eval_prompts=EVAL_PROMPTS, samples=SAMPLES, weak_below=WEAK,
                       seeds=args.seeds, warmup_steps=args.warmup_steps, rows=rows,
                       grid={str(k): v for k, v in sorted(view.items())}), t0=t0, md=md)


if __name__ == "__main__":
    run_main(main)
