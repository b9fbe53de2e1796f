"""What this proves: a run folder is owned (issue 10, classes 1-4): a second process is refused naming the folder
and the holder's PID, and the lock dies with a SIGKILLed holder; clear() (--overwrite) removes everything the old run
wrote and a SIGKILL at any call inside it leaves the old run whole or nothing of it; metrics lines survive a torn
write (repaired with a message), truncation is a new file renamed into place, gaps and repeats are named; a resume
whose run-defining fields differ is refused naming each one unless the change is allowed."""
import builtins
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import sigkill_on_call
import r3.runs.io
import r3.runs.runfolder
from r3.runs.runfolder import (RunFolder, RunFolderError, append_metrics, check_resume, check_steps, read_metrics,
                               truncate_metrics)

# holds the folder until killed (stdin stays open; it closes, and the holder exits, only if the test itself dies)
HOLD = "import sys; from r3.runs.runfolder import RunFolder; r = RunFolder(sys.argv[1]); print('held', flush=True); " \
       "sys.stdin.read()"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_second_process_is_refused_and_a_killed_holder_releases_the_lock(tmp_path):
    out = str(tmp_path / "run")
    p = subprocess.Popen([sys.executable, "-c", HOLD, out], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError, match=f"{out} is in use by another run \\(process {p.pid}\\)"):
            RunFolder(out)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    run = RunFolder(out)  # the OS dropped the dead holder's lock; the stale .lock file does not block
    with pytest.raises(RunFolderError, match="in use"):  # and this process now holds it
        RunFolder(out)
    run.release()


def old_run(out):
    for name in ("ckpt.pt", "done.json", "args.json", "metrics.jsonl"):
        with open(os.path.join(out, name), "w") as f:
            f.write("old\n")
    os.makedirs(os.path.join(out, "hf"))
    open(os.path.join(out, "hf", "config.json"), "w").close()


def test_clear_removes_everything_the_old_run_wrote_and_keeps_the_lock(tmp_path):
    out = str(tmp_path / "run")
    run = RunFolder(out)
    old_run(out)
    assert run.has_run()
    run.clear()
    assert os.listdir(out) == [".lock"] and not run.has_run()
    assert sorted(os.listdir(tmp_path)) == ["run"]  # nothing set aside is left behind
    with pytest.raises(RunFolderError, match=str(os.getpid())):
        RunFolder(out)
    run.release()


def test_a_kill_anywhere_inside_clear_leaves_the_old_run_whole_or_gone(tmp_path):
    out = str(tmp_path / "run")
    calls, seen, k = None, set(), 0
    while calls is None or k < calls:
        k += 1
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        old_run(out)
        pid = os.fork()
        if pid == 0:
            try:
                run = RunFolder(out)
                counted = sigkill_on_call(k)
                for name in ("open", "replace", "rename", "fsync", "mkdir", "makedirs", "rmdir", "unlink", "close"):
                    setattr(os, name, counted(getattr(os, name)))
                builtins.open = counted(builtins.open)
                r3.runs.runfolder.exchange = counted(r3.runs.runfolder.exchange)
                r3.runs.runfolder.shutil.rmtree = counted(r3.runs.runfolder.shutil.rmtree)
                run.clear()
                os.write(os.open(str(tmp_path / "calls"), os.O_WRONLY | os.O_CREAT), str(counted.calls[0]).encode())
            finally:
                os._exit(0)
        status = os.waitpid(pid, 0)[1]
        if calls is None and os.WIFEXITED(status):
            calls = int(open(tmp_path / "calls").read())
        names = set(os.listdir(out)) - {".lock"}
        full = {"ckpt.pt", "done.json", "args.json", "metrics.jsonl", "hf"}
        assert names in (full, set()), (k, names)  # never a part of the old run
        seen.add("old" if names else "gone")
        run = RunFolder(out)  # the next run sweeps what a killed clear() set aside
        run.release()
        assert sorted(os.listdir(tmp_path)) in (["run"], ["calls", "run"])
    assert seen == {"old", "gone"} and calls > 3


def test_metrics_survive_a_torn_line_and_truncate_by_rename(tmp_path, capsys):
    path = str(tmp_path / "metrics.jsonl")
    for s in range(4):
        append_metrics(path, dict(step=s, loss=0.1 * s))
    with open(path, "a") as f:
        f.write('{"step": 4, "lo')  # killed mid-line
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2, 3]
    assert "dropped a torn last line (line 5" in capsys.readouterr().out
    assert open(path).read().endswith("}\n") and len(read_metrics(path)) == 4  # repaired on disk
    with open(path, "a") as f:
        f.write('{"step": 4}')  # a whole record whose newline was lost: kept, and the newline added
    assert len(read_metrics(path)) == 5 and "added the missing newline" in capsys.readouterr().out
    inode = os.stat(path).st_ino
    assert [r["step"] for r in truncate_metrics(path, 2)] == [0, 1]
    assert os.stat(path).st_ino != inode and check_steps(read_metrics(path)) == 2  # a new file, renamed in
    with open(path, "a") as f:
        f.write('{"step": 2}\nnot json\n{"step": 3}\n')
    with pytest.raises(RunFolderError, match="metrics.jsonl:4: unreadable metrics line"):
        read_metrics(path)


def test_steps_must_be_contiguous():
    assert check_steps([dict(step=0), dict(step=1)]) == 2
    with pytest.raises(RunFolderError, match=r"line 3 is step 3: step\(s\) 2..2 are missing"):
        check_steps([dict(step=0), dict(step=1), dict(step=3)])
    with pytest.raises(RunFolderError, match="line 3 is step 1 again"):
        check_steps([dict(step=0), dict(step=1), dict(step=1)])


def test_resume_refuses_each_differing_field_unless_allowed(tmp_path):
    saved = dict(replay="r3", preset="toy", seed=0, lr=3e-4, task="sort", batch=[8, 4])
    same = dict(saved, batch=(8, 4), note="not a run field")
    assert check_resume(saved, same, saved.keys()) == {}
    new = dict(saved, replay="none", seed=1, lr=1e-4)
    with pytest.raises(RunFolderError, match="3 field") as e:
        check_resume(saved, new, saved.keys())
    assert "replay: saved 'r3', now 'none'" in str(e.value) and "seed: saved 0, now 1" in str(e.value)
    with pytest.raises(RunFolderError, match=r"replay: saved 'r3'") as e:
        check_resume(saved, new, saved.keys(), allow={"lr", "seed"})
    assert "lr" not in str(e.value)
    allowed = check_resume(saved, dict(saved, lr=1e-4), saved.keys(), allow={"lr"})
    assert allowed == {"lr": (3e-4, 1e-4)}
    with pytest.raises(RunFolderError, match=r"cannot allow changes to \['lrr'\]"):
        check_resume(saved, saved, saved.keys(), allow={"lrr"})
    with pytest.raises(RunFolderError, match="dense: saved '<absent>', now True"):
        check_resume(saved, dict(saved, dense=True), [*saved, "dense"])
    run = RunFolder(str(tmp_path / "run"))
    run.record_resume(5, allowed)
    assert read_metrics(run.file("resumes.jsonl")) == [dict(step=5, changes={"lr": [3e-4, 1e-4]})]
    run.release()


def test_writes_do_not_open_what_other_writers_keep_beside_them(tmp_path):
    """A sweep's runs share one folder, and their warm-ups one cache: an atomic write (a file, a folder) or a clear()
    fsyncs its parent's entries, never the siblings, which another writer may rename away in between (a flaky
    FileNotFoundError in CI, 2026-12-04). A dangling link stands for a sibling that vanished."""
    os.symlink(tmp_path / "renamed-away", tmp_path / ".tmpXYZ")
    r3.runs.io.atomic_write_json(str(tmp_path / "a.json"), dict(x=1))
    def folder(tmp):
        os.makedirs(tmp)
        with open(os.path.join(tmp, "f"), "w") as f:
            f.write("x")
    r3.runs.io.atomic_write(str(tmp_path / "folder"), folder)
    assert os.listdir(tmp_path / "folder") == ["f"]
    run = RunFolder(str(tmp_path / "run"))
    old_run(str(tmp_path / "run"))
    run.clear()
    assert sorted(os.listdir(tmp_path)) == [".tmpXYZ", "a.json", "folder", "run"]
    run.release()
