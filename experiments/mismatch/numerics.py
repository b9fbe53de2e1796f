"""What the engine's faster kernels did to the numbers the engine exists to produce: the mismatch, measured paired.

  python -m experiments.mismatch.numerics        # writes results/numerics.{json,md} (about 10 minutes on one core)

Two speed changes (docs/speed.md) replaced kernels of the rollout engine without changing what they compute:
  decode attention  low-precision engines: `r3.model.model.decode_attention` (q·k and the softmax in fp32,
                    probabilities rounded to the compute dtype before P·V, as fused kernels do) in place of SDPA's CPU
                    kernel, which computes the same in another order; fp32 engines keep SDPA
  fp32 MoE decode   the fp32 engine runs every expert on every token for batches up to 2^20 multiply-adds per
                    projection (`r3.model.moe.ALL_EXPERTS_MAX_MACS`; bf16 did so before), not the grouped GEMMs
Both move rounding only, so the sampled tokens part ways now and then, and a training run's trajectory is not the
one it was. `legacy()` (experiments/legacy.py) puts the old kernels back inside this same code, so the comparison
isolates the change.

For each setting below, each warm-up seed (the init seeds the grids use) and each of BATCHES batches, both modes
sample the same prompts with one freshly seeded generator (the same random numbers at every draw), and the fp32
trainer scores both batches (`r3.train.score.old_policy_pass`): kl, F(2), router and token flip rates, mean response
length, and the fraction of rows the two modes sampled identically. The rule, fixed before the first run: a metric
*moved* when the exact sign-flip test on its paired differences over (seed, batch) gives p < 0.05; the change is
accepted as rounding-only when no metric moved. Where the old and new kernels are the same (fp32 at 128 rows), the
batches must be bit-identical, which the script checks.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F

from experiments.common import fmt, markdown_table, write_results
from experiments.legacy import legacy
from experiments.stats import paired_permutation_test
from r3.rollout.engine import Engine
from r3.errors import run_main
from r3.train.score import old_policy_pass
from r3.tasks.tasks import EOS, PAD, make_task
from r3.train.warmup import load_model

# (name, task, warm-up steps, engine dtype, prompts per batch, group size, seeds): the headline step's engine
# (experiments.sweep HEADLINE), its oracle at the n1fresh controls' 32 rows, and the long-response study's engine
# (experiments.length.grid COMMON: 16 rows of chain:256)
SETTINGS = [("headline fp8-router", "cipher:32-32", 80, "fp8-router", 16, 8, range(8)),
            ("headline bf16", "cipher:32-32", 80, "bf16", 16, 8, range(4)),
            ("oracle fp32, 32 rows", "cipher:32-32", 80, "fp32", 4, 8, range(8)),
            ("oracle fp32, 128 rows (kernels unchanged)", "cipher:32-32", 80, "fp32", 16, 8, range(2)),
            ("length fp8-router, chain:256", "chain:256", 40, "fp8-router", 2, 8, range(4))]
BATCHES = 4
METRICS = ("kl", "extreme_frac", "router_flip_rate", "token_flip_rate", "response_length")
P_MOVED = 0.05


def measure(model, engine, examples, *, group_size: int, max_new: int, seed: int) -> tuple[dict, torch.Tensor]:
    batch = engine.generate([e.prompt for e in examples], max_new_tokens=max_new, eos_ids=(EOS,), pad_id=PAD,
                            group_size=group_size, generator=torch.Generator().manual_seed(seed))
    m = old_policy_pass(model, batch, measure=True).metrics
    m["response_length"] = float(batch.response_mask.sum(1).float().mean())
    return m, batch.tokens


def run_setting(name, task_spec, warmup, dtype, prompts, group, seeds) -> dict:
    task = make_task(task_spec)
    pairs, same_rows, identical = [], [], True
    for s in seeds:
        model, _ = load_model("toy", dense=False, task=task, task_spec=task_spec, warmup_steps=warmup, init_seed=s,
                              progress=False)
        engine = Engine(model, dtype)
        for b in range(BATCHES):
            examples = task.sample(prompts, torch.Generator().manual_seed(1_000 * s + b), split="train")
            kw = dict(group_size=group, max_new=task.max_new_tokens, seed=7_919 * s + b)
            new, tok_new = measure(model, engine, examples, **kw)
            with legacy():
                old, tok_old = measure(model, engine, examples, **kw)
            pairs.append((old, new))
            T = max(tok_new.shape[1], tok_old.shape[1])
            a, c = (F.pad(t, (0, T - t.shape[1]), value=PAD) for t in (tok_new, tok_old))
            same_rows.append(float((a == c).all(1).float().mean()))
            identical = identical and torch.equal(tok_new, tok_old) and old == new
    out = dict(name=name, task=task_spec, dtype=dtype, rows=prompts * group, seeds=list(seeds), batches=BATCHES,
               same_rows=sum(same_rows) / len(same_rows), bit_identical=identical, metrics={})
    for k in METRICS:
        olds, news = [o[k] for o, _ in pairs], [n[k] for _, n in pairs]
        diffs = [n - o for o, n in zip(olds, news)]
        mean_old = sum(olds) / len(olds)
        p = paired_permutation_test(diffs)
        out["metrics"][k] = dict(old=mean_old, new=sum(news) / len(news), diff=sum(diffs) / len(diffs),
                                 rel=(sum(diffs) / len(diffs)) / mean_old if mean_old else None, p=p,
                                 moved=p < P_MOVED)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/numerics.json", help="results file (a .md table is written beside)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    results = [run_setting(*s) for s in SETTINGS]
    rows = []
    for r in results:
        for k, m in r["metrics"].items():
            rows.append([r["name"], f"{r['rows']} x {len(r['seeds'])} seeds x {r['batches']}", k, fmt(m["old"]),
                         fmt(m["new"]), fmt(m["rel"], 100, spec="+.1f") + " %", f"{m['p']:.3g}",
                         "**moved**" if m["moved"] else "no", fmt(r["same_rows"], 100, spec=".0f") + " %"])
    moved = [f"{r['name']}: {k}" for r in results for k, m in r["metrics"].items() if m["moved"]]
    tested = sum(len(r["metrics"]) for r in results)
    broken = [r["name"] for r in results if "unchanged" in r["name"] and not r["bit_identical"]]
    verdict = (f"Rule (fixed before the run): a metric moved when the exact sign-flip test on its paired differences "
               f"gives p < {P_MOVED}. " + (f"Moved: {', '.join(moved)}" if moved else
                                           "No metric moved: the change is rounding only, by this test")
               + f" ({len(moved)} of {tested} tests; if nothing had moved, about {tested * P_MOVED:.2f} would "
                 f"cross p < {P_MOVED} by chance)."
               + (f" NOT bit-identical where the kernels are unchanged: {', '.join(broken)}." if broken else ""))
    md = markdown_table(["setting", "rows x seeds x batches", "metric", "old kernels", "new kernels",
                         "paired change", "p", "moved", "rows sampled identically"], rows) + "\n\n" + verdict
    print(md)
    write_results(args.out, dict(rule=f"moved when paired sign-flip p < {P_MOVED}", settings=results, moved=moved,
                                 not_identical_where_unchanged=broken), t0=t0, md=md)
    if broken:
        raise SystemExit(f"error: kernels that did not change gave other numbers: {broken}")


if __name__ == "__main__":
    run_main(main)
