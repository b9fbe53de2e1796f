"""The speed study's RL step section: the headline step at an older commit and at this checkout, alternated, each run
under step_timer.py (by path, with PYTHONPATH set to the tree it times), marginal seconds per step and where they went.
"""
import json
import os
import shlex
import statistics
import subprocess
import sys

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # experiments/speed/ -> root
STEP_ARMS = {"none": ("none", "fp8-router"), "r3": ("r3", "fp8-router"), "oracle": ("none", "fp32")}
STEP_KEYS = ("reward", "loss", "grad_norm", "eval/accuracy")  # what "the same trajectory" compares, step by step


def checkout(commit: str, tmp: str) -> str:
    """`commit`'s tracked files unpacked into tmp/COMMIT (git archive): an old version to time beside this one."""
    path = os.path.join(tmp, commit)
    os.makedirs(path)
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", path], input=archive, check=True)
    return path


def headline_flags(tree: str) -> list[str]:
    """The tree's own HEADLINE (each commit is timed with the flags its sweeps ran): experiments.sweep's, or
    experiments.collapse's in a commit made before the study folders."""
    code = ("try:\n    from experiments.sweep import HEADLINE\nexcept ImportError:\n"
            "    from experiments.collapse import HEADLINE\nprint(HEADLINE)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": tree})
    return out.stdout.split()


def timed_run(tree: str, flags: list[str], steps: int, tmp: str, tag: str) -> dict:
    """One train.py run under experiments/speed/step_timer.py; returns its timings and its metrics rows."""
    out, js = os.path.join(tmp, "runs", tag), os.path.join(tmp, tag + ".json")
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "speed", "step_timer.py"), tree, js, *flags, "--steps",
           str(steps), "--out", out, "--overwrite", "--quiet", "--no-plot", "--threads", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tree,
                                                                  "OMP_NUM_THREADS": "1"})
    if r.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{r.stderr[-3000:]}")
    with open(js) as f, open(os.path.join(out, "metrics.jsonl")) as m:
        return dict(json.load(f), rows=[json.loads(line) for line in m])


def same_trajectory(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in STEP_KEYS)


def bench_step(args, tmp: str) -> list[dict]:
    """Marginal seconds per step, base commit vs this checkout, each arm, the trees alternated every repetition."""
    trees = {"base": checkout(args.step_base, tmp), "head": ROOT}
    flags = {name: headline_flags(tree) for name, tree in trees.items()}
    S, L = args.step_short, args.step_long
    for name, tree in trees.items():  # untimed: builds each tree's warm-up cache
        timed_run(tree, flags[name] + ["--seed", "0"], 1, tmp, f"prime-{name}")
    res = {(t, a): [] for t in trees for a in args.step_arms}
    combos = [(rep, a) for rep in range(args.step_reps) for a in args.step_arms]
    for rep, arm in tqdm(combos, desc="step", leave=False):
        replay, dtype = STEP_ARMS[arm]
        for name in (list(trees) if rep % 2 == 0 else list(trees)[::-1]):
            f = flags[name] + ["--replay", replay, "--rollout-dtype", dtype, "--seed", "0"]
            short, long = (timed_run(trees[name], f, n, tmp, f"{name}-{arm}-{n}-{rep}") for n in (S, L))
            phases = {k: (long["phases"][k] - short["phases"].get(k, 0.0)) / (L - S) for k in long["phases"]}
            res[name, arm].append(dict(step_s=(long["wall_s"] - short["wall_s"]) / (L - S), phases=phases,
                                       cpu_step_s=(long["cpu_s"] - short["cpu_s"]) / (L - S), rows=long["rows"],
                                       faults_step=(long.get("minor_faults", 0) - short.get("minor_faults", 0)) /
                                       (L - S)))
    rows = []
    for arm in args.step_arms:
        b, h = res["base", arm], res["head", arm]
        med = lambda runs: statistics.median(r["step_s"] for r in runs)  # noqa: E731
        phase = lambda runs: {k: statistics.median(r["phases"].get(k, 0.0) for r in runs)  # noqa: E731
                              for k in sorted({k for r in runs for k in r["phases"]})}
        cpu = lambda runs: statistics.median(r["cpu_step_s"] for r in runs)  # noqa: E731
        rows.append(dict(arm=arm, base=args.step_base, base_step_s=med(b), head_step_s=med(h),
                         speedup=med(b) / med(h), base_cpu_step_s=cpu(b), head_cpu_step_s=cpu(h),
                         cpu_speedup=cpu(b) / cpu(h), base_phases_s=phase(b), head_phases_s=phase(h),
                         base_faults_step=statistics.median(r["faults_step"] for r in b),
                         head_faults_step=statistics.median(r["faults_step"] for r in h),
                         base_runs_s=[r["step_s"] for r in b], head_runs_s=[r["step_s"] for r in h],
                         same_trajectory=same_trajectory(b[0]["rows"], h[0]["rows"]),
                         base_flags=" ".join(flags["base"]), head_flags=" ".join(flags["head"])))
    return rows
