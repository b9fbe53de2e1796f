"""Claims that hold on any CPU: every number the README and docs/ use as evidence, over 8 warm-up seeds with a 95 %
interval, and the check of a remake on a kind of CPU that has no exact reference.

    python -m experiments.claims                  # init seeds 0-7, writes results/claims.{json,md} (~40 min, 1 thread)
    python -m experiments.claims --seeds 0 1 --prompts 8 --warmup-steps 4 --train-flags "--steps 2 ..."   # tiny

Why: a number made by a model reproduces bit for bit only on the kind of CPU that made it, and a warm-up turns a
kernel's last bits into other weights, so seed 0's fp8 MoE/dense kl ratio read 4.92 on one host, 1.37 on another and
3.66 on a third. One seed is one draw. Each claim here is one value per seed (init seeds 0-7, each also the seed of
the prompts and the sampling), summarized by a two-sided 95 % t-interval over the seeds: of the mean log for ratios
(a geometric mean and its interval, exponentiated: ratios are skewed and their null, 1, is 0 on that scale), of the
mean for accuracies. Each claim names its null and the side claimed; its verdict is "supported" when the interval
excludes the null on that side, "not shown" when it holds the null, "contradicted" when it excludes it on the other.

    moe_dense_kl_{bf16,fp8}   MoE kl / dense kl: the paper's "MoE >> dense"                      null 1, claimed > 1
    r3_cut_{bf16,fp8}         MoE kl / MoE + R3 kl on the same batch: what replay removes          null 1, claimed > 1
    r3_dense_kl_{bf16,fp8}    MoE + R3 kl / dense kl: the paper's "MoE + R3 ~ dense"             null 1, described only
    inspect_flipped_ratio     fp8, no replay: mean |log r| of tokens with >= 1 flipped layer / the rest  null 1, > 1
    quickstart_accuracy       `train.py --r3`: held-out accuracy after the last step, sampled       null 0, claimed > 0
    quickstart_greedy         the same, greedy                                                   null 0, claimed > 0

A seed's measurements are the single-seed entries' own code, at their settings: `experiments.mismatch_rows.measure`
(the toy MoE and its dense twin, 200 warm-up steps on sort, 512 prompts x 8 samples, bf16 and fp8 rollouts) and
`r3.tools.inspect.token_scores` / `summarize` on its fp8 MoE batch (the inspect entry's batch); and `python train.py --r3
--seed K` (experiments.quickstart's command; held-out accuracy evaluated only at the end, which leaves training as
it is: evaluation draws from its own generator). So seed 0 gives exactly the numbers of results/mismatch_table.json,
inspect.json and quickstart.json made on the same kind of CPU. The prompts stay at 512: with fewer the bf16 MoE kl,
carried by a few flipped tokens, is mostly sampling noise, and the warm-ups (cached) and the RL runs cost more.

`check` is what `python -m experiments.reproduce --check` runs on a kind of CPU with no exact reference ("claims:
interval"): it remakes the claims with the committed file's settings and, per claim,
  band  the remade seeds' mean (on the claim's scale) and the committed one pass a two-sided pooled two-sample t-test
        at ALPHA = 1e-3 (|t| <= 4.14 for 8 + 8 seeds): a wide consistency band, about 2.1 seed standard deviations
        either side at the committed spread (not "the remade mean inside the committed interval of the mean", which
        two draws of one distribution miss about 17 % of the time);
  side  where the committed claim is supported strongly enough that a fresh 8-seed draw of the same mean and spread
        would exclude the null with probability >= 1 - ALPHA (a noncentral t: the committed t >= 5.99 at 8 seeds),
        the remade interval must exclude the null on the claimed side too; weaker claims get the band alone, and
        their remade verdict is printed.
If a new kind of CPU draws the seeds' values afresh from the same distribution, each test fails by chance with
probability <= 1e-3, so the whole check (nine bands, at most seven sides) with probability <= 1.6 %; the t-tests take
the per-seed values (logs for ratios) as roughly normal. A remake is deterministic on one kind of CPU, so that is the
chance that a given new kind fails for nothing, every time: its twins (`--cpu-reference`) then make its check exact.
The committed summary must follow from its own per-seed values.
"""
import argparse
import functools
import json
import math
import multiprocessing
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from experiments.common import fmt, markdown_table, write_results
from experiments.stats import mean_sd, noncentral_t_sf, pooled_t, t_interval, t_quantile
from r3.errors import run_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEVEL = 0.95
ALPHA = 1e-3
SEEDS = tuple(range(8))
PARTS = ("mismatch", "quickstart")
# name: (the entry whose single-seed file the docs quote, part, scale, null, side, what)
CLAIMS = {
    "moe_dense_kl_bf16": ("mismatch_table", "mismatch", "log", 1.0, ">", "bf16 rollout: MoE kl / dense twin's kl"),
    "moe_dense_kl_fp8": ("mismatch_table", "mismatch", "log", 1.0, ">", "fp8 rollout: MoE kl / dense twin's kl"),
    "r3_cut_bf16": ("mismatch_table", "mismatch", "log", 1.0, ">", "bf16 rollout: MoE kl / MoE + R3 kl"),
    "r3_cut_fp8": ("mismatch_table", "mismatch", "log", 1.0, ">", "fp8 rollout: MoE kl / MoE + R3 kl"),
    "r3_dense_kl_bf16": ("mismatch_table", "mismatch", "log", 1.0, None, "bf16 rollout: MoE + R3 kl / dense kl"),
    "r3_dense_kl_fp8": ("mismatch_table", "mismatch", "log", 1.0, None, "fp8 rollout: MoE + R3 kl / dense kl"),
    "inspect_flipped_ratio": ("inspect", "mismatch", "log", 1.0, ">",
                              "fp8, no replay: mean |log r| of flipped tokens / unflipped ones"),
    "quickstart_accuracy": ("quickstart", "quickstart", "linear", 0.0, ">",
                            "train.py --r3: held-out accuracy at the end, sampled"),
    "quickstart_greedy": ("quickstart", "quickstart", "linear", 0.0, ">",
                          "train.py --r3: held-out accuracy at the end, greedy"),
}


def resting_on(entry: str) -> list[str]:
    """The claims quoted from `entry`'s single-seed files (all of them for this entry, `claims`)."""
    return [n for n, c in CLAIMS.items() if entry in ("claims", c[0])]


# ---------------------------------------------------------------------------------------------------- measuring
def mismatch_seed(seed: int, args) -> dict:
    """One seed's mismatch claims: the mismatch table's rows (bf16, fp8) and the inspector on its fp8 MoE batch."""
    from experiments.mismatch_rows import DEFAULTS, measure
    from r3.tools.inspect import summarize, token_scores
    from r3.tasks.tasks import make_task
    from r3.train.warmup import load_model
    margs = argparse.Namespace(**dict(DEFAULTS, prompts=args.prompts, seed=seed, warmup_steps=args.warmup_steps,
                                      cache_dir=args.cache_dir))
    task = make_task(margs.task)
    models = {kind: load_model("toy", dense=kind == "dense", task=task, task_spec=margs.task, init_seed=seed,
                               warmup_steps=margs.warmup_steps, cache_dir=margs.cache_dir, progress=False)[0]
              for kind in ("moe", "dense")}
    out = {}
    for dtype in ("bf16", "fp8"):
        batches = {}
        kl = {r["row"]: r["kl"] for r in measure("toy", dtype, models, task, margs, batches)}
        out |= {f"kl_{dtype}_{k}": v for k, v in kl.items()}
        out[f"moe_dense_kl_{dtype}"] = kl["MoE"] / kl["dense"]
        out[f"r3_cut_{dtype}"] = kl["MoE"] / kl["MoE + R3"]
        out[f"r3_dense_kl_{dtype}"] = kl["MoE + R3"] / kl["dense"]
        if dtype == "fp8":
            s = summarize(batches["moe"], token_scores(models["moe"], batches["moe"]))["normal"]
            out["inspect_flipped_ratio"] = s["flipped"]["mean_abs_log_r"] / s["unflipped"]["mean_abs_log_r"]
            out |= {f"inspect_{k}_tokens": s[k]["tokens"] for k in ("flipped", "unflipped")}
    return out


def quickstart_seed(seed: int, args, *, tmp: str) -> dict:
    """One seed of the README's main job, as experiments.quickstart runs it, but --seed K and one evaluation."""
    from experiments.quickstart import COMMAND
    run = os.path.join(tmp, f"quickstart-s{seed}")
    cmd = [sys.executable, *COMMAND, "--seed", str(seed), "--eval-every", "200", "--no-plot", "--threads", "1",
           *shlex.split(args.train_flags), "--out", run, "--overwrite", "--quiet"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: `{shlex.join(cmd[1:])}` exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    with open(os.path.join(run, "metrics.jsonl")) as f:
        last = [row for line in f if line.strip() and (row := json.loads(line)).get("eval/accuracy") is not None][-1]
    return dict(quickstart_accuracy=last["eval/accuracy"], quickstart_greedy=last["eval/accuracy_greedy"],
                quickstart_step=last["step"] + 1)


def _one_thread():
    import torch
    torch.set_num_threads(1)


# -------------------------------------------------------------------------------------------------- summarizing
def summarize(values: list[float], scale: str, null: float, side: str | None) -> dict:
    """A claim's mean and 95 % t-interval over seeds (geometric on the log scale), its test-scale mean and sd, its
    verdict, and the chance that a fresh draw of as many seeds would exclude the null on the claimed side."""
    f, inv = (math.log, math.exp) if scale == "log" else (float, float)
    xs = [f(v) if scale != "log" or v > 0 else -math.inf for v in values]
    if not all(math.isfinite(x) for x in xs):
        return dict(n=len(xs), mean=None, lo=None, hi=None, test_mean=None, test_sd=None, verdict="undefined",
                    replication=None)
    m, sd = mean_sd(xs)
    _, lo, hi = t_interval(xs, LEVEL) if len(xs) > 1 else (m, -math.inf, math.inf)
    z, sign = f(null), -1 if side == "<" else 1  # "<" claims the value below the null
    ahead, behind = (lo > z, hi < z) if sign > 0 else (hi < z, lo > z)
    verdict = "described" if side is None else "supported" if ahead else "contradicted" if behind else "not shown"
    rep = None
    if side is not None and len(xs) > 1:
        if sd > 0:
            delta = sign * (m - z) / (sd / math.sqrt(len(xs)))
            rep = noncentral_t_sf(t_quantile(0.5 + LEVEL / 2, len(xs) - 1), len(xs) - 1, delta)
        else:  # every seed gave the same value
            rep = 1.0 if sign * (m - z) > 0 else 0.0
    return dict(n=len(xs), mean=inv(m), lo=inv(lo) if math.isfinite(lo) else None,
                hi=inv(hi) if math.isfinite(hi) else None, test_mean=m, test_sd=sd, verdict=verdict, replication=rep)


def band(s: dict, scale: str) -> list[float] | None:
    """The remade means that pass the band test when the remade seeds are as many and as spread as these."""
    if s["test_mean"] is None or s["n"] < 2:
        return None
    half = t_quantile(1 - ALPHA / 2, 2 * s["n"] - 2) * s["test_sd"] * math.sqrt(2 / s["n"])
    inv = math.exp if scale == "log" else float
    return [inv(s["test_mean"] - half), inv(s["test_mean"] + half)]


def claim_record(name: str, seeds: list[int], values: list[float]) -> dict:
    entry, part, scale, null, side, what = CLAIMS[name]
    s = summarize(values, scale, null, side)
    return dict(what=what, entry=entry, part=part, scale=scale, null=null, side=side, seeds=seeds, values=values,
                **s, band=band(s, scale))


def markdown(claims: dict, args) -> str:
    rows = []
    for name, c in claims.items():
        unit = "×" if c["scale"] == "log" else ""
        seed0 = c["values"][c["seeds"].index(0)] if 0 in c["seeds"] else None
        rows.append([name, c["what"].replace("|", "\\|"), fmt(seed0) + unit,
                     f"{fmt(c['mean'])}{unit} [{fmt(c['lo'])}, {fmt(c['hi'])}]",
                     f"{c['side']} {fmt(c['null'])}" if c["side"] else "—", c["verdict"], fmt(c["replication"]),
                     f"[{fmt(c['band'][0])}, {fmt(c['band'][1])}]" if c["band"] else "—",
                     " ".join(fmt(v) for v in c["values"])])
    return (f"Claims over {len(args.seeds)} warm-up seeds ({' '.join(map(str, args.seeds))}): the mean (geometric "
            f"for ratios) and a two-sided {LEVEL:.0%} t-interval over the seeds. replication: the chance that a "
            "fresh draw of as many seeds with this mean and spread excludes the null on the claimed side; where it "
            f"is >= {1 - ALPHA:g}, a CPU with no exact reference must find the claim supported again. band: the "
            f"remade means that pass the consistency test (pooled two-sample t, alpha {ALPHA:g}) at this spread.\n\n"
            + markdown_table(["claim", "what", "seed 0", "mean [95 % CI]", "claimed", "verdict",
                              "replication", "band", "per seed"], rows))


# ---------------------------------------------------------------------------------------------------- checking
def check(committed: dict, remade: dict, names: list[str]) -> tuple[list[str], list[str]]:
    """Each named claim of a remake against the committed file: (one report line per claim, the failures)."""
    report, bad = [], []
    for name in names:
        c, r = committed["claims"][name], remade["claims"][name]
        if r["seeds"] != c["seeds"]:
            bad.append(f"{name}: remade over seeds {r['seeds']}, committed over {c['seeds']}")
            continue
        again = summarize(c["values"], c["scale"], c["null"], c["side"])
        stale = [k for k, v in again.items() if not _same(v, c.get(k))]
        if stale:
            bad.append(f"{name}: the committed {', '.join(stale)} do not follow from its per-seed values")
            continue
        if None in (c["test_mean"], r["test_mean"]):
            bad.append(f"{name}: undefined (a ratio's value <= 0 or not finite): committed {c['values']}, "
                       f"remade {r['values']}")
            continue
        t, df = pooled_t(r["test_mean"], r["test_sd"], r["n"], c["test_mean"], c["test_sd"], c["n"])
        limit = t_quantile(1 - ALPHA / 2, df)
        ok_band = abs(t) <= limit
        checks_side = c["side"] is not None and (c["replication"] or 0) >= 1 - ALPHA
        ok_side = not checks_side or r["verdict"] == "supported"
        unit = "×" if c["scale"] == "log" else ""
        line = (f"{name}: committed {fmt(c['mean'])}{unit} [{fmt(c['lo'])}, {fmt(c['hi'])}] ({c['verdict']}), "
                f"remade {fmt(r['mean'])}{unit} [{fmt(r['lo'])}, {fmt(r['hi'])}] ({r['verdict']}); band: two-sample "
                f"t {t:+.2f}, |t| <= {limit:.2f} {'ok' if ok_band else 'FAILS'}; side: "
                + (f"{c['side']} {fmt(c['null'])} {'ok' if ok_side else 'FAILS'}" if checks_side else
                   "not checked (" + ("none claimed" if c["side"] is None else
                                      f"committed replication {fmt(c['replication'])} < {1 - ALPHA:g}") + ")"))
        report.append(line)
        if not (ok_band and ok_side):
            bad.append(line)
    return report, bad


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


_REMADE = {}  # (the committed settings, part) -> the remade claims of that part: one remake per part and process


def remade_claims(committed_path: str, parts: list[str]) -> dict:
    """The claims of `parts` remade with the settings recorded in the committed file (each part run once per process,
    in a subprocess, into a temp folder)."""
    with open(committed_path) as f:
        key = json.dumps(json.load(f)["args"], sort_keys=True)
    todo = [p for p in parts if (key, p) not in _REMADE]
    if todo:
        with tempfile.TemporaryDirectory(prefix="claims-remade-") as tmp:
            out = os.path.join(tmp, "claims.json")
            cmd = [sys.executable, "-m", "experiments.claims", "--from", committed_path, "--parts", *todo,
                   "--jobs", "2", "--out", out]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
            r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"{r.stdout[-2000:]}{r.stderr[-2000:]}\nerror: `{shlex.join(cmd[1:])}` exited "
                                 f"{r.returncode}")
            with open(out) as f:
                got = json.load(f)["claims"]
        for p in todo:
            _REMADE[key, p] = {n: c for n, c in got.items() if c["part"] == p}
    return {n: c for p in parts for n, c in _REMADE[key, p].items()}


def interval_check(entry: str, committed_path: str, rel: str) -> list[str]:
    """`--check` of `entry` on a kind of CPU with no exact reference: remake the claims resting on it and test them
    against the committed file (`check`). Prints one line per claim; returns the failures, prefixed with `rel`."""
    with open(committed_path) as f:
        committed = json.load(f)
    names = resting_on(entry)
    absent = [n for n in names if n not in committed.get("claims", {})]
    names = [n for n in names if n not in absent]
    parts = [p for p in PARTS if any(CLAIMS[n][1] == p for n in names)]
    wall = sum((committed.get("wall_s") or {}).get(p, 0) for p in parts)
    print(f"[{entry}] claims: interval: remaking {', '.join(parts)} over seeds "
          f"{' '.join(map(str, committed['args']['seeds']))} with {rel}'s settings (~{wall:.0f} s there, "
          "once per part)", flush=True)
    remade = remade_claims(committed_path, parts)
    report, bad = check(committed, dict(claims=remade), names)
    for line in report:
        print(f"[{entry}]   {line}", flush=True)
    print(f"[{entry}] claims: interval: {len(names)} claims tested, "
          f"{'all pass' if not bad and not absent else f'{len(bad) + len(absent)} FAIL'}", flush=True)
    if bad:
        print(f"[{entry}] note: each test fails by chance with probability <= {ALPHA:g} when this kind of CPU draws "
              "the seeds' values from the committed distribution; if the code did not change these numbers, add this "
              f"CPU's twins with --only {entry} --cpu-reference", flush=True)
    return [f"{rel}: {line}" for line in bad] + [f"{rel}: {n}: absent from the committed file" for n in absent]


# ------------------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), help="warm-up (init) seeds, one value each")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                   help="mismatch: the mismatch table's and the inspector's claims; quickstart: the README job's")
    p.add_argument("--prompts", type=int, default=512, help="mismatch: prompts per seed and precision (x 8 samples)")
    p.add_argument("--warmup-steps", type=int, default=200, help="mismatch: SFT warm-up steps of MoE and dense")
    p.add_argument("--train-flags", default="", help="quickstart: flags added to `train.py --r3 --seed K` "
                   "(tests: a tiny run)")
    p.add_argument("--cache-dir", default=".cache/warmup", help="mismatch: warm-up checkpoint cache (train.py "
                   "keeps its own in .cache/warmup)")
    p.add_argument("--from", dest="source", default=None, metavar="CLAIMS_JSON",
                   help="take --seeds, --prompts, --warmup-steps and --train-flags from this claims file (a remake)")
    p.add_argument("--jobs", type=int, default=1, help="seeds measured at once, one process and one thread each "
                   "(the values do not depend on it)")
    p.add_argument("--out", default="results/claims.json", help="the claims (and .md beside it)")
    args = p.parse_args(argv)
    if args.source:
        with open(args.source) as f:
            recorded = json.load(f)["args"]
        for k in ("seeds", "prompts", "warmup_steps", "train_flags"):
            setattr(args, k, recorded[k])
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from r3.runs.provenance import git_state
    torch.set_num_threads(1)
    t0, git = time.time(), git_state()  # the code this run imports (and train.py's, unless edited while it runs)
    per_seed, wall = {s: {} for s in args.seeds}, {}
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="claims-") as tmp, \
            ProcessPoolExecutor(args.jobs, mp_context=spawn, initializer=_one_thread) as pool:
        for part in [p for p in PARTS if p in args.parts]:
            t1 = time.time()
            fn = mismatch_seed if part == "mismatch" else functools.partial(quickstart_seed, tmp=tmp)
            futures = {pool.submit(fn, s, args): s for s in args.seeds}  # one thread each: the values do not
            for f in as_completed(futures):                               # depend on --jobs
                s = futures[f]
                per_seed[s] |= f.result()
                got = " ".join(f"{n} {fmt(v)}" for n, v in per_seed[s].items() if n in CLAIMS)
                print(f"[claims] {part} seed {s}, {time.time() - t1:.0f} s into the part: {got}", flush=True)
            wall[part] = round(time.time() - t1, 1)
    names = [n for n, c in CLAIMS.items() if c[1] in args.parts]
    claims = {n: claim_record(n, list(args.seeds), [per_seed[s][n] for s in args.seeds]) for n in names}
    md = markdown(claims, args)
    print(md)
    report = dict(args={k: v for k, v in vars(args).items() if k not in ("source", "out", "jobs")}, level=LEVEL,
                  alpha=ALPHA,
                  interval=f"two-sided {LEVEL:.0%} t-interval over seeds; ratios on the log scale (geometric mean)",
                  claims=claims, per_seed=[dict(seed=s, **per_seed[s]) for s in args.seeds], wall_s=wall)
    write_results(args.out, report, t0=t0, md=md, git=git)
    return report


if __name__ == "__main__":
    run_main(main)
