"""Test helper (no tests here): train.py stopped at a known point of its run, not at a moment a test guesses, so
that a test that kills or holds a run does not race the machine's speed.

    python tests/stopped.py K kill ARGS...   train.py ARGS, SIGKILLed right after it wrote its K-th metrics line
                                             (before that step's checkpoint is saved)
    python tests/stopped.py K save ARGS...   SIGKILLed inside its K-th save of ckpt.pt: the temporary file is
                                             written, not yet renamed over ckpt.pt
    python tests/stopped.py K hold ARGS...   after its K-th metrics line it prints "held" and blocks, holding its run
                                             folder, until it is killed (or its stdin closes: then it exits)
`held(argv, cwd)` starts the last one and returns once it holds.
"""
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOPPED = os.path.abspath(__file__)


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


def main() -> None:
    k, how, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    assert how in ("kill", "save", "hold"), how
    sys.path.insert(0, ROOT)  # this checkout's r3, whatever the working directory
    import r3.runs.checkpoint
    import r3.runs.runfolder
    count = [0]
    if how == "save":
        write = r3.runs.checkpoint.atomic_write

        def atomic_write(path, fn):  # r3.runs.io.atomic_write, cut after its temporary file on the K-th save of ckpt.pt
            count[0] += os.path.basename(path) == "ckpt.pt"
            if count[0] == k and os.path.basename(path) == "ckpt.pt":
                fn(path + ".tmp")
                stop("kill")
            write(path, fn)
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
