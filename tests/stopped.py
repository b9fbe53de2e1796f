"""Test helper (no tests here): train.py stopped at a known point of its run, not at a moment a test guesses, so
that a test that kills or holds a run does not race the machine's speed.

    python tests/stopped.py K kill ARGS...   train.py ARGS, SIGKILLed right after it wrote its K-th metrics line
                                             (before that step's checkpoint is saved)
    python tests/stopped.py K save ARGS...   SIGKILLed inside its K-th save of ckpt.pt: the temporary file is
                                             written, not yet renamed over ckpt.pt
    python tests/stopped.py K hold ARGS...   after its K-th metrics line it prints "held" and blocks, holding its run
                                             folder, until it is killed (or its stdin closes: then it exits)
    python tests/stopped.py K int|term|usr1[@R] ARGS...
                                             sends itself SIGINT / SIGTERM / SIGUSR1 in its K-th step (at the guard's
                                             check, before the step's metrics line); @R: only the process of RANK R
    python tests/stopped.py K int2 ARGS...   SIGINT in its K-th step, and a second SIGINT inside the save that
                                             follows, once that save's temporary file is written
    python tests/stopped.py K full:PATTERN ARGS...
                                             the K-th write of a file whose name matches PATTERN (fnmatch; an atomic
                                             write by its final name, a metrics.jsonl append) fails as on a full
                                             disk: part of its bytes are written, then OSError ENOSPC
    python tests/stopped.py K fsize:PATTERN ARGS...
                                             at the K-th write of PATTERN the file-size limit (ulimit -f) drops to
                                             the bytes that file holds plus 64: the kernel itself cuts the write
                                             (EFBIG), as torch's and safetensors' own writers meet it
`held(argv, cwd)` starts the hold mode and returns once it holds.
"""
import errno
import fnmatch
import importlib.util
import os
import resource
import runpy
import signal
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOPPED = os.path.abspath(__file__)


def bind_r3() -> None:
    """Import this checkout's r3 package as `r3` (what train.py, run from this checkout, imports), without editing
    sys.path: run as a script, this file sees tests/ first on the path and maybe another checkout's r3 installed."""
    init = os.path.join(ROOT, "r3", "__init__.py")
    spec = importlib.util.spec_from_file_location("r3", init, submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["r3"] = module
    spec.loader.exec_module(module)


def held(argv: list[str], cwd) -> subprocess.Popen:
    """`stopped.py 1 hold` + train.py `argv`; returns once the run holds its folder after its first metrics line."""
    err = tempfile.TemporaryFile("w+")  # a file, not a pipe: train.py's progress bar can never fill it and block
    p = subprocess.Popen([sys.executable, STOPPED, "1", "hold", *argv], cwd=cwd, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=err, text=True)
    timer = threading.Timer(600, p.kill)  # a bound only: a run that never gets there is ended, and the test fails
    timer.start()
    try:
        for line in p.stdout:
            if line.strip() == "held":
                return p
    finally:
        timer.cancel()
    p.wait()
    err.seek(0)
    raise AssertionError(f"train.py ended (status {p.returncode}) before its first metrics line: {err.read()[-3000:]}")


def stop(how: str) -> None:
    if how == "hold":
        print("held", flush=True)
        sys.stdin.read()  # returns only when the test closes stdin (or dies); the test usually kills us first
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL)


def sabotaged(how: str, k: int):
    """Wrappers for r3's two write helpers (atomic_write, append_jsonl) that make the K-th write of PATTERN fail."""
    import r3.runs.io
    kind, pattern = how.split(":", 1)
    count = [0]

    def armed(path, held: int = 0) -> bool:
        """Counts a write of `path`; True when it is the K-th and must fail as on a full disk. `held`: the bytes
        the written file holds now (an append's)."""
        name = os.path.basename(path.rstrip(os.sep))
        count[0] += fnmatch.fnmatch(name, pattern)
        if count[0] != k or not fnmatch.fnmatch(name, pattern):
            return False
        if kind == "fsize":
            resource.setrlimit(resource.RLIMIT_FSIZE, (held + 64, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        return kind == "full"

    def no_space():
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def atomic(write):
        def atomic_write(path, fn, *a, **kw):
            if not armed(path):
                return write(path, fn, *a, **kw)

            def cut(tmp):  # the temporary file is written, then cut to half as the disk fills
                fn(tmp)
                os.truncate(tmp, os.path.getsize(tmp) // 2)
                raise no_space()
            return write(path, cut, *a, **kw)
        return atomic_write

    def append(add):
        def append_jsonl(path, record):
            if not armed(path, os.path.getsize(path)):
                return add(path, record)

            def half_open(*a, **kw):  # r3.runs.io's open, for this one call: half of the line, then ENOSPC
                f = open(*a, **kw)
                real = f.write

                def write(text):
                    real(text[:len(text) // 2])
                    f.flush()
                    raise no_space()
                f.write = write
                return f
            r3.runs.io.open = half_open
            try:
                return add(path, record)
            finally:
                del r3.runs.io.open
        return append_jsonl
    return atomic, append


def main() -> None:
    k, how, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    sig = dict(int=signal.SIGINT, term=signal.SIGTERM, usr1=signal.SIGUSR1, int2=signal.SIGINT)
    assert how in ("kill", "save", "hold") or how.split("@")[0] in sig or how.split(":")[0] in ("full", "fsize"), how
    bind_r3()  # this checkout's r3, whatever the working directory and whatever r3 is installed
    import r3.runs.checkpoint
    import r3.runs.io
    import r3.runs.runfolder
    import r3.train.guard
    count = [0]
    if how.split(":")[0] in ("full", "fsize"):
        atomic, append = sabotaged(how, k)
        for module in (r3.runs.io, r3.runs.checkpoint):  # before train.py imports them
            module.atomic_write = atomic(module.atomic_write)
        r3.runs.runfolder.append_jsonl = append(r3.runs.runfolder.append_jsonl)
    elif how.split("@")[0] in sig:
        signum, rank = sig[how.split("@")[0]], how.split("@")[1] if "@" in how else None
        check = r3.train.guard.CollapseGuard.check

        def guard_check(self, m):  # once per step, on every rank
            count[0] += 1
            if count[0] == k and rank in (None, os.environ.get("RANK", "0")):
                os.kill(os.getpid(), signum)
            return check(self, m)
        r3.train.guard.CollapseGuard.check = guard_check
        if how == "int2":
            write = r3.runs.checkpoint.atomic_write

            def atomic_write(path, fn, *a, **kw):  # the save after the first SIGINT: a second one inside it
                def interrupted(tmp):
                    fn(tmp)
                    if count[0] >= k and os.path.basename(path) == "ckpt.pt":
                        os.kill(os.getpid(), signal.SIGINT)
                return write(path, interrupted, *a, **kw)
            r3.runs.checkpoint.atomic_write = atomic_write
    elif how == "save":
        write = r3.runs.checkpoint.atomic_write

        def atomic_write(path, fn, *a, **kw):  # r3.runs.io.atomic_write, cut after its temporary file on the K-th save
            count[0] += os.path.basename(path) == "ckpt.pt"
            if count[0] == k and os.path.basename(path) == "ckpt.pt":
                fn(path + ".tmp")
                stop("kill")
            write(path, fn, *a, **kw)
        r3.runs.checkpoint.atomic_write = atomic_write
    else:
        append = r3.runs.runfolder.append_metrics

        def append_metrics(path, row):
            append(path, row)
            count[0] += 1
            if count[0] == k:
                stop(how)
        r3.runs.runfolder.append_metrics = append_metrics  # before train.py imports it
    sys.argv = [os.path.join(ROOT, "train.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
