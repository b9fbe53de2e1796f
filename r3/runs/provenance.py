"""Provenance: which code, software and machine produced a run folder or a results file, and how long it took.

  provenance(argv, t0)        dict: git commit and dirty flag, torch / Python versions, torch threads, machine,
                              start time and wall time, the exact command line
  stamp(run_dir, argv, t0)    writes RUN/provenance.json (atomically) and returns the dict
  earlier_segments(run_dir)   what a resumed run's earlier processes ran: their commits, dirty flags and times
  markdown_line(prov)         one line for a results table; it says **dirty tree** when the code was not committed

The commit is that of the checkout holding this package (not of the current directory); outside a git checkout, or
without git, `commit` and `dirty` are None. A long run reads it once, at its start (`git=`): the code a process runs
is what it imported then, whatever the checkout holds by its end. A resumed run also lists its earlier processes
under `segments` (commit, dirty, started, finished, cpu), so a run continued at another commit, or on another kind
of CPU, says so.
`dirty` counts changed tracked files and untracked (not ignored) `.py` files, code that may have run. It never counts
what commands write: anything under the output folders `results/` and `runs/` (no code lives there), nor the paths
passed as `outputs`. So a command that writes several results files (a table, then a second table beside it) stamps
each of them clean at a clean commit, and so does a rerun over its own uncommitted outputs. Left out: pip freeze,
environment variables other than the thread settings, the host name.
"""
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import torch

from r3.runs.io import atomic_write_json

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # r3/runs/ -> root
OUTPUT_DIRS = ("results/", "runs/")  # what commands write; a change there is an output, never code


def _git(repo: str, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _is_output(path: str, outputs: tuple[str, ...]) -> bool:
    return path.startswith(OUTPUT_DIRS) or any(path == o or path.startswith(o.rstrip("/") + "/") for o in outputs)


def git_state(repo: str = REPO, outputs=()) -> dict:
    """commit (full hash), dirty (bool) and the changed paths (at most 20), or None-valued outside a checkout.
    `outputs`: files or folders the command writes (absolute, or relative to the current directory); their changes,
    like those under OUTPUT_DIRS, do not count."""
    commit = _git(repo, "rev-parse", "HEAD")
    if commit is None or not commit.strip():
        return dict(commit=None, dirty=None, changed=None)
    status = _git(repo, "-c", "core.quotepath=off", "status", "--porcelain", "--untracked-files=all")
    root = os.path.realpath(repo)
    outs = tuple(os.path.relpath(os.path.realpath(o), root) for o in outputs)
    changed = None if status is None else [
        path for line in status.splitlines() if line.strip()
        for path in [line[3:].split(" -> ")[-1]]  # a rename counts as its new path
        if (not line.startswith("??") or path.endswith(".py")) and not _is_output(path, outs)]
    return dict(commit=commit.strip(), dirty=None if changed is None else bool(changed),
                changed=None if changed is None else changed[:20])


def provenance(argv: list[str] | None = None, t0: float | None = None, *, repo: str = REPO, outputs=(),
               git: dict | None = None, segments: list | None = None) -> dict:
    """Everything needed to say what produced a result. t0 is a time.time() start. argv: the arguments after
    `python` (e.g. ["train.py", "--r3"]); default: this process's own (`sys.orig_argv`, so `-m pkg.mod` is kept).
    outputs: paths this command writes (see `git_state`). git: the commit / dirty / changed read when the process
    started (default: read now). segments: a resumed run's earlier processes (`earlier_segments`)."""
    argv = list(sys.orig_argv[1:] if argv is None else argv)
    now = time.time()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    state = git_state(repo, outputs) if git is None else {k: git.get(k) for k in ("commit", "dirty", "changed")}
    extra = {} if segments is None else dict(segments=list(segments))
    return dict(**state, **extra, torch=torch.__version__, cuda=torch.version.cuda, gpu=gpu,
                python=platform.python_version(), threads=torch.get_num_threads(),
                omp_num_threads=os.environ.get("OMP_NUM_THREADS"), platform=platform.platform(),
                machine=platform.machine(), cpu=cpu_name(), cpu_capability=torch.backends.cpu.get_cpu_capability(),
                cpu_count=os.cpu_count(),
                started=None if t0 is None else _iso(t0), finished=_iso(now),
                wall_s=None if t0 is None else round(now - t0, 3),
                argv=argv, command=shlex.join([os.path.basename(sys.executable), *argv]), cwd=os.getcwd())


ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")  # the ones CPU kernels dispatch on


def cpu_name() -> str:
    """The CPU's model name and its vector extensions (`ISA_FLAGS`): kernels differ between CPU generations, and a
    warm-up amplifies a last-bit difference into other weights, so a result is bit-reproducible on the kind of CPU it
    was made on, not on every x86 machine (seen 2026-12-04: files made on one host did not reproduce on an AMX one)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return platform.processor() or platform.machine()
    lines = text.splitlines()
    name = next((ln.partition(":")[2].strip() for ln in lines if ln.startswith("model name")), "")
    flags = set(next((ln.partition(":")[2].split() for ln in lines if ln.startswith("flags")), []))
    name = name or platform.processor() or platform.machine()
    return f"{name} [{' '.join(f for f in ISA_FLAGS if f in flags)}]"


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def stamp(run_dir: str, argv: list[str] | None = None, t0: float | None = None, **kw) -> dict:
    """Write RUN/provenance.json; call it at the end of a run (wall time, with the start's `git=`) or at its
    start (t0=None)."""
    prov = provenance(argv, t0, **kw)
    os.makedirs(run_dir, exist_ok=True)
    atomic_write_json(os.path.join(run_dir, "provenance.json"), prov)
    return prov


def earlier_segments(run_dir: str) -> list[dict]:
    """The processes that ran RUN before this one, from its provenance.json (none if it has none or cannot be
    read): each one's commit, dirty flag, start and finish (None when it was killed before its end stamp), and the
    kind of CPU it ran on (a run resumed on another machine changes its numerics there: docs/reproduce.md)."""
    try:
        with open(os.path.join(run_dir, "provenance.json")) as f:
            prev = json.load(f)
    except (OSError, ValueError):
        return []
    if not isinstance(prev, dict):
        return []
    ended = prev.get("wall_s") is not None  # an end stamp; a start stamp's one time is when it was written
    return [*prev.get("segments", []), dict(commit=prev.get("commit"), dirty=prev.get("dirty"),
                                            started=prev.get("started") if ended else prev.get("finished"),
                                            finished=prev.get("finished") if ended else None, cpu=prev.get("cpu"))]


def markdown_line(prov: dict) -> str:
    """One line for a results table, e.g. `code 1a2b3c4 (dirty tree) · torch 2.13.0 · ... · python train.py --r3`."""
    if prov.get("commit") is None:
        code = "code: not a git checkout"
    else:
        code = f"code `{prov['commit'][:10]}`" + (" (**dirty tree**)" if prov.get("dirty") else "")
    wall = "" if prov.get("wall_s") is None else f" · wall {prov['wall_s']:.1f} s"
    gpu = f", {prov['gpu']}" if prov.get("gpu") else ""
    return (f"{code} · torch {prov['torch']} · Python {prov['python']} · {prov['threads']} thread"
            f"{'s' if prov['threads'] != 1 else ''} · {prov['machine']}, {prov['cpu_count']} CPUs{gpu}{wall} · "
            f"`{prov['command']}`")
