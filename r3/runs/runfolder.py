"""A run folder that one process owns: an exclusive lock, an atomic clear for --overwrite, a safe metrics log, and
the check that a resumed run is the run that was saved.

  run = RunFolder(out)            # creates OUT, locks OUT/.lock (flock) for the life of the process, or raises
                                  #   RunFolderError naming the folder and the holder's PID
  run.clear()                     # --overwrite: everything the old run wrote is gone, in one atomic swap
  run.has_run()                   # does OUT hold anything but the lock?
  metrics = read_metrics(path)    # repairs a torn last line (with a message); refuses other damage naming the line
  check_steps(metrics)            # steps must be 0..n-1; otherwise a message that says which is missing or repeated
  truncate_metrics(path, step)    # keep the lines with step < `step` (resume): a new file, renamed over the old
  append_metrics(path, record)    # one fsynced line (`r3.runs.io.append_jsonl`)
  check_resume(saved, new, keys, allow)   # refuse a resume whose run-defining fields differ, naming each one
  run.record_resume(step, changes)        # log an allowed change in OUT/resumes.jsonl
  check_output_folder(path, flag)         # before any work: `path` can be a folder (not a file, nor below one)
  snapshot_steps(path) / snapshots_to_keep(steps, n) / remove_snapshots(path, steps)
                                          # the collapse guard's OUT/collapse_stepN(.pt), at most n of them

The lock is `fcntl.flock` on OUT/.lock: the OS drops it when the process dies (SIGKILL included), so a stale
.lock file never blocks a new run. The file descriptor is close-on-exec, so programs the run execs do not inherit
the lock; a child made by a bare fork (no exec) does, and keeps the folder locked until it exits.

Left out on purpose: locks on network filesystems where flock is advisory or local only (some NFS setups), and
deciding which fields define a run (the caller passes `keys`).
"""
import fcntl
import json
import os
import re
import shutil

from r3.errors import InputError
from r3.runs.io import append_jsonl, exchange, fsync_dir, write_jsonl

LOCK = ".lock"


class RunFolderError(InputError, RuntimeError):
    """A run folder that cannot be used as asked. The message names the folder and what to do."""


def check_output_folder(path: str, flag: str) -> None:
    """Raise RunFolderError unless `path` is a folder or can be made one: not a file, not below a file, and its
    nearest existing parent writable. Called before any work, so a typo in --out costs nothing."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunFolderError(f"{flag} {path} is a file, not a folder")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise RunFolderError(f"{flag} {path}: {parent} is a file, so no folder can be made below it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunFolderError(f"{flag} {path}: {parent} is not writable")


def _take_lock(path: str) -> int:
    fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunFolderError(f"{path} is in use by another run (process {holder}); wait for it, stop it, or pass "
                             f"another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    os.fsync(fd)
    return fd


class RunFolder:
    """OUT, locked by this process until `release()` or the process ends."""

    def __init__(self, path: str):
        self.path = path.rstrip(os.sep) or os.sep
        os.makedirs(self.path, exist_ok=True)
        self._fd = _take_lock(self.path)
        for stale in (self.path + ".clear", self.path + ".clear.old"):  # left by a clear() that was killed
            shutil.rmtree(stale, ignore_errors=True)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def has_run(self) -> bool:
        """True when OUT holds anything besides the lock (a previous run's files)."""
        return any(n != LOCK for n in os.listdir(self.path))

    def clear(self) -> None:
        """Remove everything a previous run wrote, before this one writes anything (for --overwrite).

        A fresh folder holding a new, already locked .lock is swapped with OUT in one atomic step, then the old
        folder is deleted: a kill at any point leaves OUT either complete and old, or empty. Where the OS cannot
        swap (not Linux), OUT is renamed aside first, then the fresh folder renamed into place.
        """
        fresh = self.path + ".clear"
        shutil.rmtree(fresh, ignore_errors=True)
        os.makedirs(fresh)
        fd = _take_lock(fresh)
        if exchange(fresh, self.path):
            gone = fresh
        else:
            gone = self.path + ".clear.old"
            os.replace(self.path, gone)
            try:
                os.replace(fresh, self.path)
            except OSError as e:  # another process created OUT in the gap: it owns it now
                os.close(fd)
                raise RunFolderError(f"{self.path} was created by another process while it was being cleared; "
                                     f"the old run is in {gone}") from e
        os.close(self._fd)  # the old lock; the old folder is no longer reachable at OUT
        self._fd = fd
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        shutil.rmtree(gone)

    def record_resume(self, step: int, changes: dict) -> None:
        """Append one line to OUT/resumes.jsonl: the step a resume started at and each allowed change."""
        append_jsonl(self.file("resumes.jsonl"), dict(step=step, changes={k: list(v) for k, v in changes.items()}))

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---- metrics.jsonl -----------------------------------------------------------------------------------------------

def read_metrics(path: str, *, repair: bool = True) -> list[dict]:
    """Every record of a metrics log ([] if there is none).

    A last line without its newline was cut by a killed writer: with `repair` it is dropped from the file (or, when
    it holds a whole record, given its newline), with a printed message. An unreadable line anywhere else raises
    RunFolderError naming the line: that is damage a kill cannot cause.
    """
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records = [_record(path, n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not tail.strip():
        return records
    try:
        records.append(_record(path, len(lines) + 1, tail))
        what = "added the missing newline to the last line"
    except RunFolderError:
        what = f"dropped a torn last line (line {len(lines) + 1}, {len(tail)} bytes)"
    if repair:
        print(f"{path}: {what}, left by a killed writer")
        write_jsonl(path, records)
    return records


def _record(path: str, n: int, line: bytes) -> dict:
    try:
        obj = json.loads(line.decode("utf-8"))
    except ValueError as e:
        raise RunFolderError(f"{path}:{n}: unreadable metrics line ({e}); only a torn last line can be repaired: "
                             f"fix or remove the file") from e
    if not isinstance(obj, dict) or isinstance(obj.get("step"), bool) or not isinstance(obj.get("step"), int):
        raise RunFolderError(f"{path}:{n}: a metrics line must be a JSON object with an integer 'step'")
    return obj


def check_steps(records: list[dict], where: str = "metrics.jsonl") -> int:
    """Raise unless the records' steps are exactly 0, 1, ..., n-1; return n."""
    for i, r in enumerate(records):
        if r["step"] > i:
            raise RunFolderError(f"{where}: line {i + 1} is step {r['step']}: step(s) {i}..{r['step'] - 1} are "
                                 f"missing (steps must run 0..n-1)")
        if r["step"] < i:
            raise RunFolderError(f"{where}: line {i + 1} is step {r['step']} again after step {i - 1} (steps must "
                                 f"run 0..n-1 without repeats)")
    return len(records)


def truncate_metrics(path: str, step: int) -> list[dict]:
    """Keep the records with step < `step` (those logged up to a checkpoint), atomically; returns them."""
    kept = [r for r in read_metrics(path) if r["step"] < step]
    write_jsonl(path, kept)
    return kept


def append_metrics(path: str, record: dict) -> None:
    append_jsonl(path, record)


# ---- the collapse guard's snapshots ------------------------------------------------------------------------------

SNAPSHOT = re.compile(r"collapse_step(\d+)(\.pt)?$")  # collapse_stepN.pt (one process), collapse_stepN/ (--model)


def snapshot_steps(path: str) -> list[int]:
    """The steps of the guard snapshots in run folder `path`, in order."""
    found = (SNAPSHOT.match(n) for n in (os.listdir(path) if os.path.isdir(path) else []))
    return sorted({int(m.group(1)) for m in found if m})


def snapshots_to_keep(steps: list[int], keep: int) -> list[int]:
    """Of the snapshot steps `steps`, those `--guard-snapshots keep` keeps: the first and the latest keep - 1."""
    steps = sorted(set(steps))
    if keep == 0 or not steps:
        return []
    return steps[:1] + (steps[1:][-(keep - 1):] if keep > 1 else [])


def remove_snapshots(path: str, steps: list[int]) -> None:
    for step in steps:
        for name in (f"collapse_step{step}.pt", f"collapse_step{step}"):
            p = os.path.join(path, name)
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.remove(p)


# ---- resume ------------------------------------------------------------------------------------------------------

_MISSING = "<absent>"


def check_resume(saved: dict, new: dict, keys, allow: set = frozenset()) -> dict:
    """Compare the fields that define a run; raise RunFolderError naming every difference not in `allow`.

    Returns the allowed differences as {key: (saved, new)}, for `RunFolder.record_resume`. Values are compared as
    JSON would store them (a tuple equals a list). A key in `allow` that is not in `keys` is refused (a typo).
    """
    keys = list(keys)
    unknown = sorted(set(allow) - set(keys))
    if unknown:
        raise RunFolderError(f"cannot allow changes to {unknown}: not fields that define a run ({', '.join(keys)})")

    def norm(d, k):  # compared as stored: a tuple equals a list, NaN equals NaN
        return json.dumps(d[k], sort_keys=True, default=str) if k in d else _MISSING
    diff = {k: (saved.get(k, _MISSING), new.get(k, _MISSING)) for k in keys if norm(saved, k) != norm(new, k)}
    refused = {k: v for k, v in diff.items() if k not in allow}
    if refused:
        what = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in refused.items())
        raise RunFolderError(f"the resumed run differs from the saved one in {len(refused)} field(s) that define "
                             f"it: {what}; pass the saved values, or allow the change explicitly (--allow-change "
                             f"{','.join(refused)})")
    return {k: v for k, v in diff.items() if k in allow}
