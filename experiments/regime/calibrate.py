"""The regime table and the calibration, before any grid run: `python -m experiments.regime`.

Each measurement is one small JSON in OUT/measure/ (committed), made once and reused, so the command resumes:
  start-SETTING-sS      a seed's start-matched warm-up, measured under the setting's engine (measure.py)
  after200-SETTING-sS   the policy of the setting's none/n4 grid run at step 200 (the run is the grid's own: its
                        first 200 steps, in the grid's runs folder, which the grid later extends bit for bit)
  fixed80-sS            the natural position on a fixed 80-step warm-up: the start without start-matching
  depthL-sS             the deep shape at L layers, natural fp8-router, for the depth rule
  walkT-sS              walk:T at the paper-matched position, for the walk length rule
  timing                the deep preset's step time against the toy's (timing())
The steps pilot (r3 at the strongest position, 1000 steps) runs in RUNS/pilot, its records in OUT/pilot-records; the
walk demo (the oracle engine on walk:64 and on the cipher, DEMO_STEPS steps, seeds 0 and 1) in RUNS/demo, its records
in OUT/demo-records. Measurements run in parallel (--jobs), one thread each.
"""
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from experiments.regime import design
from experiments.regime.measure import Spec, deep_config, measure, setting_spec, start_model, step_model
from experiments.sweep import finished, run_all, set_flag
from r3.runs.io import atomic_write_json, read_jsonl
from r3.runs.provenance import git_state, provenance
from r3.tasks.tasks import make_task
from r3.train.warmup import preset_config, warmed_up_model


def _job(kind: str, name: str, seed: int, extra: dict) -> dict:
    """One measurement (runs in a worker process, one thread)."""
    torch.set_num_threads(1)
    if kind == "start":
        spec = setting_spec(name, **extra)
        model, task, info = start_model(spec, seed)
        return dict(measure(model, task, spec), warmup=info)
    if kind == "after":
        spec = setting_spec(name, **{k: v for k, v in extra.items() if k != "run_dir"})
        model = step_model(extra["run_dir"], spec, design.AFTER_STEPS)
        return measure(model, make_task(spec.task), spec)
    if kind == "fixed80":
        spec = setting_spec("natural")
        task = make_task(spec.task)
        model, _ = warmed_up_model(preset_config("toy", task), task, spec.task, steps=80, seed=seed, progress=False)
        return measure(model.float().eval(), task, spec)
    if kind == "depth":
        spec = Spec(f"depth{name}", "cipher:32-32", design.ENGINE, None, layers=int(name))
        model, task, info = start_model(spec, seed)
        return dict(measure(model, task, spec), warmup=info)
    if kind == "walk":
        spec = Spec(f"walk{name}", f"walk:{name}", design.ENGINE, design.POSITIONS[extra["paper"]])
        model, task, info = start_model(spec, seed)
        return dict(measure(model, task, spec), warmup=info)
    raise ValueError(kind)


def measure_all(out: str, jobs: list[tuple[str, str, int, dict]], workers: int, job=None) -> dict:
    """{file key: result} for `jobs` (kind, name, seed, extra), each read from OUT/measure/KEY.json when made;
    `job(kind, name, seed, extra)` makes one (default: this module's `_job`; a picklable module-level function)."""
    folder = os.path.join(out, "measure")
    os.makedirs(folder, exist_ok=True)
    key = lambda kind, name, seed: f"{kind}-{name}-s{seed}"  # noqa: E731
    have, todo = {}, []
    for kind, name, seed, extra in jobs:
        path = os.path.join(folder, key(kind, name, seed) + ".json")
        if os.path.exists(path):
            with open(path) as f:
                have[key(kind, name, seed)] = json.load(f)
        else:
            todo.append((kind, name, seed, extra))
    if todo:
        print(f"measuring {len(todo)} of {len(jobs)} ({len(jobs) - len(todo)} already in {folder})", flush=True)
        git, t0 = git_state(outputs=(out,)), time.time()  # the checkout as the measurements started
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for (kind, name, seed, _), res in zip(todo, pool.map(job or _job, *zip(*todo))):
                res = dict(res, provenance=provenance(git=git, t0=t0))
                atomic_write_json(os.path.join(folder, key(kind, name, seed) + ".json"), res)
                have[key(kind, name, seed)] = res
                print(f"  {key(kind, name, seed)}: token flips {res.get('token_flip_rate')}, kl {res['kl']:.3g}",
                      flush=True)
    return have


def made(out: str, kind: str) -> dict:
    """Every measurement of `kind` already in OUT/measure."""
    folder, have = os.path.join(out, "measure"), {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith(kind + "-") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                have[name[:-5]] = json.load(f)
    return have


def interval(xs: list[float]) -> dict:
    """Mean and a 95 % t interval over seeds (t quantiles for 2-30 values; None-valued with fewer than 2)."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return dict(mean=None, lo=None, hi=None, n=0)
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return dict(mean=m, lo=None, hi=None, n=1)
    t = T975[min(len(xs) - 1, len(T975) - 1)]
    h = t * statistics.stdev(xs) / len(xs) ** 0.5
    return dict(mean=m, lo=m - h, hi=m + h, n=len(xs))


# two-sided 95 % Student t quantiles by degrees of freedom (index), 1..30; beyond, the last
T975 = (None, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
QUANTITIES = ("router_flip_rate", "token_flip_rate", "flips_per_token", "abs_log_ratio_q50", "abs_log_ratio_q90",
              "abs_log_ratio_q99", "abs_log_ratio_q99.9", "extreme_frac", "kl", "kl_r3", "response_length",
              "entropy", "exposure", "reward")


def summarise(results: dict, kind: str, name: str, seeds) -> dict:
    rs = [results[f"{kind}-{name}-s{s}"] for s in seeds if f"{kind}-{name}-s{s}" in results]
    return {q: interval([r.get(q) for r in rs]) for q in QUANTITIES}


def closest(table: dict, quantity: str, target: float) -> str:
    return min(table, key=lambda p: (abs(table[p]["start"][quantity]["mean"] - target), p))


def depth_rule(results: dict) -> dict:
    """DEPTH_TEXT on the depth measurements made so far: {depth, measured: {L: mean token flips}, decided}. The
    deepest depth is decided without its own measurement (the rule takes it whether or not it passes); `measured`
    then lacks it."""
    measured = {}
    for L in design.DEPTHS:
        flips = [results.get(f"depth-{L}-s{s}", {}).get("token_flip_rate") for s in design.DEPTH_SEEDS]
        if None in flips:  # the deepest is the fallback: once every shallower depth failed, the outcome is known
            last = L == design.DEPTHS[-1]
            return dict(depth=L if last else None, measured=measured, decided=last)
        measured[L] = statistics.fmean(flips)
        if measured[L] >= design.DEPTH_TOKEN_FLIPS:
            return dict(depth=L, measured=measured, decided=True)
    return dict(depth=design.DEPTHS[-1], measured=measured, decided=True)


def measure_depths(out: str, res: dict, workers: int) -> dict:
    """The depth rule's measurements, shallowest first, deeper ones only while the rule is undecided; the fallback
    (the deepest) is measured too, though the rule takes it either way. Adds them to `res`; returns depth_rule."""
    for L in design.DEPTHS:
        res.update(measure_all(out, [("depth", str(L), s, {}) for s in design.DEPTH_SEEDS], workers))
        depth = depth_rule(res)
        if depth["decided"] and depth["depth"] in depth["measured"]:
            return depth
    return depth


def steps_rule(rows_by_seed: list[list[dict]]) -> dict:
    """STEPS_TEXT on the pilot runs' metrics rows."""
    evals = [{r["step"]: r["eval/accuracy"] for r in rows if r.get("eval/accuracy") is not None}
             for rows in rows_by_seed]
    steps = sorted(set.intersection(*(set(e) for e in evals)))
    mean = [statistics.fmean(e[s] for e in evals) for s in steps]
    plateau = next(s for i, s in enumerate(steps) if all(m <= mean[i] + 0.02 for m in mean[i:]))
    chosen = min(design.PILOT_STEPS, max(design.MIN_STEPS, -(-(plateau + 1 + 100) // 100) * 100))
    return dict(plateau_step=plateau, steps=chosen, curve=dict(zip(steps, mean)))


def pilot_runs(out: str, runs_dir: str, jobs: int, grid_runs) -> tuple[list, list]:
    """The steps pilot: r3 at the strongest position, PILOT_SEEDS, PILOT_STEPS, its own folders (RUNS/pilot) and
    records (OUT/pilot-records, committed)."""
    runs = [grid_runs(f"{design.STRONGEST}/r3/n4", s, os.path.join(runs_dir, "pilot"), design.PILOT_STEPS)
            for s in design.PILOT_SEEDS]
    records = os.path.join(out, "pilot-records")
    run_all(runs, jobs=jobs, log_dir=os.path.join(runs_dir, "pilot", "logs"), records=records)
    return runs, [finished(o, flags, n, records)[1] for o, flags, n in runs]


def deep_warmup(res: dict, depth: dict) -> dict:
    """The start-matched warm-ups of the depth rule's seeds at the chosen depth (what DEEP_RUN_TEXT reads)."""
    if not depth.get("decided"):
        return {}
    return {str(s): res[f"depth-{depth['depth']}-s{s}"]["warmup"] for s in design.DEPTH_SEEDS
            if f"depth-{depth['depth']}-s{s}" in res}


def deep_shapes() -> dict:
    return {L: deep_config(L).__dict__ for L in design.DEPTHS}


def after_runs(args, names: list[str]) -> dict:
    """The none/n4 runs of `names` to AFTER_STEPS in the grid's runs folder; returns {(name, seed): run dir} of those
    whose measurement is not made yet."""
    from experiments.regime.grid import cell_run
    todo = {}
    for name in names:
        for s in args.seeds:
            if not os.path.exists(os.path.join(args.out, "measure", f"after-{name}-s{s}.json")):
                todo[name, s] = cell_run(f"{name}/none/n4", s, args.runs_dir, design.AFTER_STEPS)
    if todo:
        run_all(list(todo.values()), jobs=args.jobs, log_dir=os.path.join(args.runs_dir, "logs"))
    return {k: v[0] for k, v in todo.items()}


def timing(args) -> dict:
    """The deep preset's RL step time against the toy's, alternated in one invocation (train.py, 6 steps, one
    thread, twice each; the median of steps 1-5 of each run)."""
    import subprocess
    import sys
    import tempfile
    from experiments.regime.grid import cell_run
    times = {"toy": [], "deep": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(2):
            for name, setting in (("toy", "natural"), ("deep", "deep")):
                out, flags, _ = cell_run(f"{setting}/none/n4", 0, tmp, 6)
                i = flags.index("--warmup-until")  # random init: a 48-layer warm-up takes most of an hour
                flags = set_flag(flags[:i] + flags[i + 2:], "--warmup-steps", "0")
                flags = [f for f in flags if f != "--eval-trainer"]  # no evaluation in a timing run
                out = f"{out}-{rep}"
                subprocess.run([sys.executable, os.path.join(calibrate_root(), "train.py"), *flags, "--steps", "6",
                                "--out", out, "--quiet", "--no-plot", "--threads", "1", "--eval-every", "0",
                                "--fidelity-every", "0", "--dump-every", "0"], check=True, capture_output=True)
                times[name] += [r["step_time"] for r in read_jsonl(os.path.join(out, "metrics.jsonl"))[1:]]
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(step_time_s=med, ratio=med["deep"] / med["toy"], note="train.py steps 1-5 of two 6-step runs each, "
                "alternated, one thread, from a random init (no warm-up), no evaluation, fidelity or dumps (the "
                "grid's other flags)")


DEMO_STEPS, DEMO_SEEDS = 300, (0, 1)
# The first demo (walk:64, the cipher) found the per-position credit paid a self-loop; the exact-reward walks were
# added after it, and after the grid began (they carry no grid cell): walk:16:exact, whose start-matched warm-up
# reached 0.06 exact in 400 steps (seed 0), and walk:64:exact, 0.008.
DEMO_TASKS = ("walk:64", "cipher:32-32", "walk:16:exact", "walk:64:exact")
DEMO_FOLDERS = {"walk:64": "walk", "cipher:32-32": "cipher"}  # the first demo's folder names, so its runs are found


def walk_demo(out: str, runs_dir: str, jobs: int) -> dict:
    """Does the toy learn the walk tasks under the oracle engine, and does their entropy stay above the cipher's? Each,
    the grid's oracle/none/n4 flags otherwise: held-out accuracy by evaluation, and the mean entropy of the last 50
    steps that measured it."""
    from experiments.regime.grid import cell_run
    runs = {}
    for task in DEMO_TASKS:
        for s in DEMO_SEEDS:
            o, flags, n = cell_run("oracle/none/n4", s, os.path.join(runs_dir, "demo"), DEMO_STEPS)
            folder = f"{o}-{DEMO_FOLDERS.get(task, task.replace(':', '-'))}"
            runs[task, s] = (folder, set_flag(flags, "--task", task), n)
    records = os.path.join(out, "demo-records")
    run_all(list(runs.values()), jobs=jobs, log_dir=os.path.join(runs_dir, "demo", "logs"), records=records)
    res = {}
    for (task, s), r in runs.items():
        rows = finished(*r, records)[1]
        ent = [x["entropy"] for x in rows if x["step"] >= DEMO_STEPS - 50 and x.get("entropy") is not None]
        res.setdefault(task, []).append(dict(
            seed=s, heldout=[[x["step"], x["eval/accuracy"]] for x in rows if x.get("eval/accuracy") is not None],
            first_entropy=rows[0]["entropy"], final_entropy=statistics.fmean(ent), final_reward=rows[-1]["reward"]))
    return res


def calibrate_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(args, t0: float) -> dict:
    from experiments.regime import report
    seeds, out = list(args.seeds), args.out
    names = list(design.POSITIONS) + ["oracle"]
    jobs = [("start", n, s, {}) for n in names for s in seeds] + [("fixed80", "natural", s, {}) for s in seeds]
    res = measure_all(out, jobs, args.jobs)
    if args.start_only:
        return res
    table = {n: dict(start=summarise(res, "start", n, seeds)) for n in names}
    dial = {n: table[n] for n in design.POSITIONS}
    paper = closest(dial, "router_flip_rate", design.PAPER["router_flip_rate"])
    if paper == design.STRONGEST:
        paper = list(design.POSITIONS)[list(design.POSITIONS).index(paper) - 1]
    token_matched = closest(dial, "token_flip_rate", design.PAPER["token_flip_rate"])
    if "after" not in args.skip:
        dirs = after_runs(args, names)
        res.update(measure_all(out, [("after", n, s, dict(run_dir=d)) for (n, s), d in dirs.items()], args.jobs))
    res.update(made(out, "after"))
    for n in names:
        if all(f"after-{n}-s{s}" in res for s in seeds):
            table[n]["after"] = summarise(res, "after", n, seeds)
    pilot = None
    if "pilot" not in args.skip:
        from experiments.regime.grid import cell_run
        rows = pilot_runs(out, args.runs_dir, args.jobs, cell_run)[1]
        pilot = steps_rule(rows)
    res.update(made(out, "depth"))
    res.update(made(out, "walk"))
    depth = depth_rule(res)
    if "depth" not in args.skip:
        depth = measure_depths(out, res, args.jobs)
    walk = {}
    if "walk" not in args.skip:
        res.update(measure_all(out, [("walk", str(T), s, dict(paper=paper)) for T in design.WALK_LENGTHS
                                     for s in design.DEPTH_SEEDS], args.jobs))
    walk = {T: summarise(res, "walk", str(T), design.DEPTH_SEEDS) for T in design.WALK_LENGTHS
            if f"walk-{T}-s{design.DEPTH_SEEDS[0]}" in res}
    demo = walk_demo(out, args.runs_dir, args.jobs) if "walk" not in args.skip else None
    from r3.model.model import PRESETS
    preset_ok = depth["decided"] and PRESETS.get("qwen3-routing") == deep_config(depth["depth"], vocab=16)
    if depth["decided"] and not preset_ok:
        print(f"note: r3/model/model.py's qwen3-routing preset is not the depth rule's {depth['depth']} layers "
              f"(deep_config({depth['depth']}, vocab=16)); no timing until it is")
    timed = None
    if "timing" not in args.skip and preset_ok:  # made once, like the measurements (measure/timing.json)
        path = os.path.join(out, "measure", "timing.json")
        if os.path.exists(path):
            with open(path) as f:
                timed = json.load(f)
        else:
            git, t1 = git_state(outputs=(out,)), time.time()
            timed = dict(timing(args), provenance=provenance(git=git, t0=t1))
            atomic_write_json(path, timed)
    starts = [dict(seed=s, fixed80=res[f"fixed80-natural-s{s}"]["reward"],
                   matched=res[f"start-natural-s{s}"]["reward"],
                   warmup_steps=res[f"start-natural-s{s}"]["warmup"]["steps"]) for s in seeds]
    plan = dict(positions=design.POSITIONS, strongest=design.STRONGEST, paper_text=design.PAPER_MATCHED_TEXT,
                depth_text=design.DEPTH_TEXT, steps_text=design.STEPS_TEXT, warmup_until=design.WARMUP_UNTIL,
                warmup_cap=design.WARMUP_CAP, common=design.COMMON, seeds=seeds,
                measure=dict(prompts=design.MEASURE_PROMPTS, samples=design.MEASURE_SAMPLES, seed=design.MEASURE_SEED))
    data = dict(design=plan, paper=design.PAPER, table=table, paper_matched=paper, token_matched=token_matched,
                depth=depth, deep_shapes=deep_shapes(), deep_warmup=deep_warmup(res, depth), walk=walk,
                walk_demo=demo, pilot=pilot, timing=timed, starts=starts, complete=all(x not in args.skip for x in ("depth", "after", "pilot", "walk")))
    report.write_regime(out, data, t0)
    return data
