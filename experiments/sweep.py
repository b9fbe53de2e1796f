"""Run many `train.py` arms as subprocesses (in parallel, one thread each) and summarise their metrics.

Used by every study (experiments/collapse/, staleness/, length/, regime/). Every arm is one `train.py` command line;
arms of one ablation share every flag but the one under study. A sweep resumes: finished runs are skipped, partial ones
are continued with `--resume` (which is bit-identical on CPU). The same flags with a larger --steps extend finished runs
to the longer horizon; any other change of flags is refused.

Records: a run folder holds checkpoints (megabytes) and is not committed, so a finished run also leaves a record,
RECORDS/NAME.jsonl.gz (a header line with its flags, done.json and commit, and for a run resumed across processes
the earlier ones' commits, then its metrics rows with floats to 7 significant digits, `step_time` dropped; about
50 KB per 1000 steps). A grid passes `records=` to `run_all` and reads its runs with `finished`: a run whose record
matches its flags counts as finished without its folder, so a committed grid resumes in a fresh clone, and its
tables are made from the records alone.

The flags the studies share live here too: COMMON (the toy setting) and HEADLINE (the collapse protocol's update,
which the staleness and regime grids start from), with `with_lr`, `flag_value`, `flag_dict` and `set_flag` to read
and edit a flag list.
"""
import gzip
import json
import os
import re
import subprocess
import sys
import time

from tqdm import tqdm

from r3.errors import InputError
from r3.runs.ema import ema_series
from r3.runs.io import atomic_write, read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLAPSE_SYMPTOMS = ("reward_drop", "nonfinite")  # what counts as a collapse in tables (others are precursors)


# The toy setting every experiment shares (calibrated once, identical for every arm); see README "Results". The
# cipher task is long (33-token responses), has an 80-token vocabulary, and the toy climbs on it from 0 to > 0.9
# held-out accuracy under RL. This is the standard, clipped update (trainer π_old, PPO clip, grad clip 1).
COMMON = ("--task cipher:32-32 --preset toy --warmup-steps 80 --prompts-per-step 16 --group-size 8 --lr 3e-4 "
          "--val-every 50 --eval-every 50 --eval-prompts 128")
RUNS_DIR = os.path.join("results", "ablations", "runs")

# The headline setting: the toy on the cipher task (33-token responses, 80-token vocabulary; it climbs from 0 to
# > 0.9 held-out accuracy) with the most exposed update: the engine's log-probs as π_old, PPO clipping and gradient
# clipping off, held-out accuracy and gradient fidelity logged, the mismatch (kl, F(2), flips, staleness) every 10
# steps (it changes nothing but the log; its forward is then skipped on 9 steps in 10). The same for every arm.
HEADLINE = COMMON + (" --old-logp engine --clip-low 1 --clip-high 1e6 --grad-clip inf --fidelity-every 25 "
                     "--mismatch-every 10")


def arm_run(*, replay: str, seed: int, dtype: str, loss: str = "grpo", is_correction: str = "none",
            mini_steps: int = 4, common: str = COMMON, runs_dir: str = RUNS_DIR) -> tuple[str, list[str]]:
    """(out_dir, train.py flags) for one arm; the name is a function of the flags, so experiments share runs."""
    name = f"{dtype}-{loss}-{is_correction}-{replay}-m{mini_steps}-s{seed}"
    flags = [*common.split(), "--replay", replay, "--seed", str(seed), "--rollout-dtype", dtype, "--loss", loss,
             "--is-correction", is_correction, "--mini-steps", str(mini_steps)]
    return os.path.join(runs_dir, name), flags


def reached(done: dict, steps: int) -> bool:
    """A run's done.json says it reached `steps` or stopped early (on a collapse guard)."""
    return done["stopped_on"] is not None or done["steps"] >= steps


def is_done(out: str, steps: int) -> bool:
    """train.py writes done.json when it reaches --steps or stops on collapse."""
    if not os.path.exists(os.path.join(out, "done.json")):
        return False
    with open(os.path.join(out, "done.json")) as f:
        return reached(json.load(f), steps)


def same_command(saved: list[str], args: list[str]) -> bool:
    """`saved` (a run's flags and `--steps N`) is the command line `args` at some horizon."""
    return saved[:-1] == [*args, "--steps"]


def other_flags(where: str, saved: list[str], args: list[str], steps: int, advice: str) -> RuntimeError:
    """The refusal of a run folder or record made by another command line than this one."""
    return RuntimeError(f"{where} was run with different flags:\n  {' '.join(saved)}\nnot\n  {' '.join(args)} "
                        f"--steps {steps}\n{advice}")


RECORD_VERSION = 1
RECORD_DROP = ("step_time",)  # wall time: not a function of the flags, and it would make records differ run to run


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.7g}")
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def record_path(out: str, records: str) -> str:
    return os.path.join(records, os.path.basename(out.rstrip(os.sep)) + ".jsonl.gz")


def write_record(out: str, records: str) -> str:
    """The record of the finished run folder `out` (its sweep_flags.json, done.json, commit, the kind of CPU it ran
    on, and metrics), written atomically; gzip without a time stamp, so the same run makes the same bytes. The CPU
    matters: a run's numbers are bit-reproducible only on the kind it was made on (docs/reproduce.md)."""
    def load(name):
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    prov = load("provenance.json") if os.path.exists(os.path.join(out, "provenance.json")) else {}
    head = dict(record=RECORD_VERSION, name=os.path.basename(out.rstrip(os.sep)), flags=load("sweep_flags.json"),
                done=load("done.json"), commit=prov.get("commit"), cpu=prov.get("cpu"))
    if prov.get("segments"):  # resumed: the commits (and CPUs) the earlier processes ran, oldest first
        head["earlier_commits"] = [seg.get("commit") for seg in prov["segments"]]
        head["earlier_cpus"] = [seg.get("cpu") for seg in prov["segments"]]
    rows = [_round({k: v for k, v in r.items() if k not in RECORD_DROP})
            for r in read_jsonl(os.path.join(out, "metrics.jsonl"))]
    text = "\n".join(json.dumps(x) for x in [head, *rows]) + "\n"
    path = record_path(out, records)
    os.makedirs(records, exist_ok=True)

    def write(tmp):
        with open(tmp, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as g:
            g.write(text.encode())
    atomic_write(path, write)
    return path


def read_record(path: str) -> tuple[dict, list[dict]]:
    """(header, metrics rows) of a record; a damaged file raises InputError (one line from a script) naming it."""
    try:
        with gzip.open(path, "rt") as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if not lines or lines[0].get("record") != RECORD_VERSION:
            raise ValueError("no record header")
    except (OSError, EOFError, ValueError) as e:
        raise InputError(f"{path}: not a readable run record ({e}); delete it to rerun that run") from None
    return lines[0], lines[1:]


def finished(out: str, args: list[str], steps: int, records: str) -> tuple[dict, list[dict]] | None:
    """(header, rows) of a finished run: from its record, else from its finished folder (which then gets its
    record); None when neither has finished. A record made with other flags raises, like a run folder."""
    path = record_path(out, records)
    if os.path.exists(path):
        head, rows = read_record(path)
        if not same_command(head["flags"], args):
            raise other_flags(path, head["flags"], args, steps, "remove it to rerun that run")
        if reached(head["done"], steps):
            return head, rows
    if os.path.exists(os.path.join(out, "sweep_flags.json")) and is_done(out, steps):
        with open(os.path.join(out, "sweep_flags.json")) as f:
            if same_command(json.load(f), args):
                return read_record(write_record(out, records))
    return None


def log_tail(path: str, lines: int = 15) -> str:
    """The last `lines` lines of a run's log, progress-bar redraws (carriage returns) dropped: what a failed run
    printed last, so the error says why it failed where only the sweep's own output is kept (a CI log)."""
    try:
        with open(path, errors="replace", newline="") as f:  # newline="": keep the \r that text mode would turn into \n
            text = f.read()
    except OSError as e:
        return f"(unreadable: {e})"
    kept = [ln.rstrip("\r").rsplit("\r", 1)[-1].rstrip() for ln in text.split("\n")]  # splitlines() splits at \r
    return "\n".join([ln for ln in kept if ln.strip()][-lines:]) or "(empty)"


def run_all(runs: list[tuple], *, steps: int | None = None, jobs: int = 2, log_dir: str,
            records: str | None = None, on_finish=None) -> None:
    """runs: (out_dir, train.py args without --out) pairs, run for `steps`, or (out_dir, args, steps) triples.
    Runs up to `jobs` at once; a failed run raises. With `records` (a folder), a run whose record is finished
    is skipped, and every run that finishes leaves its record there; `on_finish(out_dir)` is called after it, for
    whatever else must be kept from the run folder before it can be lost."""
    os.makedirs(log_dir, exist_ok=True)
    runs = [(r[0], r[1], r[2] if len(r) > 2 else steps) for r in runs]
    total = len(runs)
    if records is not None:
        runs = [(out, args, n) for out, args, n in runs if finished(out, args, n, records) is None]
    for out, args, n in runs:  # a run folder is reused only by the exact same command line
        flags_path = os.path.join(out, "sweep_flags.json")
        if os.path.exists(flags_path):
            with open(flags_path) as f:
                old = json.load(f)
            if not same_command(old, args) or int(old[-1]) > n:
                raise other_flags(out, old, args, n, "choose another --runs-dir or remove it")
            if int(old[-1]) < n:  # a longer horizon extends the run (train.py --resume continues it exactly)
                with open(flags_path, "w") as f:
                    json.dump([*args, "--steps", str(n)], f)
        else:
            os.makedirs(out, exist_ok=True)
            with open(flags_path, "w") as f:
                json.dump([*args, "--steps", str(n)], f)
    todo = [(out, args, n) for out, args, n in runs if not is_done(out, n)]
    skipped = total - len(todo)
    if skipped:
        print(f"{skipped} of {total} runs already finished; skipping them")
    running: list[tuple[subprocess.Popen, str, object]] = []
    bar = tqdm(total=len(todo), desc="runs")
    while todo or running:
        while todo and len(running) < jobs:
            out, args, n = todo.pop(0)
            log = open(os.path.join(log_dir, os.path.basename(out) + ".log"), "w")
            cmd = [sys.executable, os.path.join(ROOT, "train.py"), *args, "--steps", str(n), "--out", out,
                   "--resume", "--quiet", "--no-plot", "--threads", "1"]
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), out, log))
        time.sleep(0.5)
        for item in list(running):
            p, out, log = item
            if p.poll() is not None:
                log.close()
                running.remove(item)
                bar.update(1)
                if p.returncode != 0:
                    for q, _, _ in running:
                        q.kill()
                    raise RuntimeError(f"run {out} failed (exit {p.returncode}); the end of {log.name}:\n"
                                       f"{log_tail(log.name)}")
                if records is not None:
                    write_record(out, records)
                if on_finish is not None:
                    on_finish(out)
    bar.close()


def summarize(rows: list[dict], tail: int = 20) -> dict:
    """Per-run numbers for the tables: final/best reward, first collapse step, mismatch peaks."""
    if not rows:
        return {}
    collapse = next((r["step"] for r in rows if set(r.get("symptoms", [])) & set(COLLAPSE_SYMPTOMS)), None)
    fin = [r["reward"] for r in rows[-tail:]]
    best = max(ema_series([r["reward"] for r in rows]))
    finite = lambda k: [r[k] for r in rows if r.get(k) is not None and r[k] == r[k]]  # noqa: E731
    evals = [r for r in rows if r.get("eval/accuracy") is not None]  # held-out: every --eval-every steps and the end
    return dict(steps=len(rows), final_reward=sum(fin) / len(fin), best_reward_ema=best, collapse_step=collapse,
                heldout_accuracy=evals[-1]["eval/accuracy"] if evals else None,
                heldout_greedy=evals[-1]["eval/accuracy_greedy"] if evals else None,
                best_heldout_accuracy=max((r["eval/accuracy"] for r in evals), default=None),
                max_kl=max(finite("kl"), default=None),
                mean_kl=sum(finite("kl")) / len(finite("kl")) if finite("kl") else None,
                max_extreme_frac=max(finite("extreme_frac"), default=None),
                max_grad_norm=max(finite("grad_norm"), default=None),
                mean_router_flip_rate=(sum(finite("router_flip_rate")) / len(finite("router_flip_rate"))
                                       if finite("router_flip_rate") else None))


def with_lr(common: str, lr: float | None) -> str:
    return common if lr is None else re.sub(r"--lr\s+\S+", "", common).strip() + f" --lr {lr:g}"


def flag_dict(flags: list[str]) -> dict:
    """{--name: value} of a flag list, True for a switch (`--eval-trainer`); a flag given twice is an error."""
    out = {}
    for i, tok in enumerate(flags):
        if tok.startswith("--"):
            if tok in out:
                raise ValueError(f"{tok} is given twice in {flags}")
            out[tok] = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else True
    return out


def flag_value(flags: list[str], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else default


def set_flag(flags: list[str], name: str, value: str) -> list[str]:
    out = list(flags)
    if name in out:
        out[out.index(name) + 1] = value
    else:
        out += [name, value]
    return out
