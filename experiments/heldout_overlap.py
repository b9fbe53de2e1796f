"""How much of the held-out set the supervised warm-up has seen, and what that does to the held-out score.

The warm-up (`r3.train.warmup.supervised_warmup`) draws its examples from the whole task with a generator seeded by the
init seed; the held-out set (`r3.train.evaluate.heldout_examples`) is drawn from the eval split with a generator seeded
0. At init seed 0 the warm-up replays the stream the held-out set was picked from. This script counts, per init seed,
how many held-out prompts the warm-up trains on (and the warm-up step of the last), and scores warm-up models of
`--score-seeds` on the held-out set against a disjoint set of other eval-split prompts (fp32 engine, 4 samples per
prompt and one greedy answer, generator seed 0), so the contaminated seed's gap can be read beside clean seeds'.
`--count-task` adds the counts alone for a second task (the length grid's chain:T, 40 warm-up steps).

    python -m experiments.heldout_overlap [--out results/heldout_overlap.json]
"""
import argparse
import time

import torch

from experiments.common import fmt, markdown_table, write_results
from r3.rollout.engine import Engine
from r3.errors import run_main
from r3.train.evaluate import evaluate, heldout_examples
from r3.tasks.tasks import EOS, PAD, make_task
from r3.train.warmup import preset_config, warmed_up_model

OTHER_SEED = 12_345  # the disjoint comparison set's draw


def seen_in_warmup(task, heldout, *, steps: int, batch_size: int, seed: int) -> tuple[int, int | None]:
    """(how many of `heldout` the warm-up at `seed` trains on, the warm-up step of the last one first seen)."""
    want, first = {tuple(e.prompt) for e in heldout}, {}
    g = torch.Generator().manual_seed(seed)  # the warm-up's own draws (r3.train.warmup.stream_digest draws the same)
    for step in range(steps):
        for e in task.sample(batch_size, g):
            if tuple(e.prompt) in want:
                first.setdefault(tuple(e.prompt), step)
    return len(first), max(first.values(), default=None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="cipher:32-32", help="the task (the staleness grid's)")
    ap.add_argument("--warmup-steps", type=int, default=80, help="warm-up steps (the staleness grid's)")
    ap.add_argument("--eval-prompts", type=int, default=128, help="held-out prompts (the staleness grid's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(8)), help="init seeds to count")
    ap.add_argument("--score-seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4],
                    help="init seeds whose warm-up is scored")
    ap.add_argument("--count-task", default="chain:1024", help="a second task, counted only ('' for none)")
    ap.add_argument("--count-warmup-steps", type=int, default=40, help="its warm-up steps")
    ap.add_argument("--count-eval-prompts", type=int, default=8, help="its held-out prompts asked for")
    ap.add_argument("--batch-size", type=int, default=64, help="warm-up batch size (r3.train.warmup's default)")
    ap.add_argument("--preset", default="toy")
    ap.add_argument("--out", default="results/heldout_overlap.json")
    args = ap.parse_args(argv)
    t0 = time.time()
    torch.set_num_threads(1)
    task = make_task(args.task)
    held = heldout_examples(task, args.eval_prompts)
    held_prompts = {tuple(h.prompt) for h in held}
    other = [e for e in heldout_examples(task, 2 * args.eval_prompts, seed=OTHER_SEED)
             if tuple(e.prompt) not in held_prompts][:args.eval_prompts]
    counts = []
    for spec, steps, n_eval in [(args.task, args.warmup_steps, args.eval_prompts)] + (
            [(args.count_task, args.count_warmup_steps, args.count_eval_prompts)] if args.count_task else []):
        t = make_task(spec)
        h = held if spec == args.task else heldout_examples(t, n_eval)
        for seed in args.seeds:
            n, last = seen_in_warmup(t, h, steps=steps, batch_size=args.batch_size, seed=seed)
            counts.append(dict(task=spec, warmup_steps=steps, seed=seed, heldout=len(h), seen=n, last_step=last))
    scores = []
    cfg = preset_config(args.preset, task)
    kw = dict(max_new_tokens=task.max_new_tokens, eos_ids=(EOS,), pad_id=PAD, samples=4)
    for seed in args.score_seeds:
        model, _ = warmed_up_model(cfg, task, args.task, steps=args.warmup_steps, seed=seed,
                                   batch_size=args.batch_size)
        engine = Engine(model, "fp32")
        for name, examples in (("heldout", held), ("other", other)):
            m = evaluate(engine, task, examples, generator=torch.Generator().manual_seed(0), **kw)
            scores.append(dict(seed=seed, set=name, prompts=len(examples), **{k[5:]: m[k] for k in (
                "eval/accuracy_greedy", "eval/reward_greedy", "eval/accuracy", "eval/reward")}))
    md = "\n\n".join([
        "Held-out prompts the supervised warm-up trains on (its draws replayed, no model):",
        markdown_table(["task", "warm-up steps", "init seed", "held-out prompts", "seen by the warm-up",
                        "last first seen at step"],
                       [[c["task"], str(c["warmup_steps"]), str(c["seed"]), str(c["heldout"]), str(c["seen"]),
                         fmt(c["last_step"])] for c in counts]),
        f"Warm-up models scored on the held-out set and on {len(other)} other eval-split prompts (fp32 engine):",
        markdown_table(["init seed", "set", "greedy accuracy", "greedy reward", "sampled accuracy", "sampled reward"],
                       [[str(s["seed"]), s["set"], fmt(s["accuracy_greedy"]), fmt(s["reward_greedy"]),
                         fmt(s["accuracy"]), fmt(s["reward"])] for s in scores])])
    print(md)
    write_results(args.out, dict(task=args.task, warmup_steps=args.warmup_steps, eval_prompts=args.eval_prompts,
                                 other_seed=OTHER_SEED, counts=counts, scores=scores), t0=t0, md=md)


if __name__ == "__main__":
    run_main(main)
