"""What this proves: `r3.errors.run_main` turns a refusal (an InputError or one of its subclasses, an OSError about a
named path, a sys.exit message, a failed write) into exactly one `error: ...` line on stderr and exit status 1,
without a traceback (a deliberate stop: its one line and status 128 + the signal; a bare Ctrl-C: one line, 130);
--debug (removed before the script's parser sees it) and R3_DEBUG=1 show the traceback; a bug, an ordinary exit and
argparse's exit pass through untouched; and every entry point (train.py, rollout.py, python -m r3.check, r3.inspect,
r3.plots, r3.serve, experiments.*) runs through it, as a real process shows."""
import os
import subprocess
import sys

import pytest

from r3.errors import InputError, run_main
from r3.scale.hf import CheckpointError
from r3.model.moe import RoutesError
from r3.runs.runfolder import RunFolderError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def call(main, argv, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    with pytest.raises(SystemExit) as e:
        run_main(main)
    return e.value.code, capsys.readouterr().err


def raising(exc):
    def main():
        raise exc
    return main


@pytest.mark.parametrize("exc, line", [
    (InputError("rollouts/step3: field 'rewards' row 2 is nan"), "error: rollouts/step3: field 'rewards' row 2 is "
                                                                 "nan"),
    (RoutesError("r"), "error: r"), (CheckpointError("c"), "error: c"), (RunFolderError("f"), "error: f"),
    (FileNotFoundError(2, "No such file or directory", "runs/x/args.json"),
     "error: No such file or directory (runs/x/args.json)"),
    (IsADirectoryError(21, "Is a directory", "out", None, "out.tmp"), "error: Is a directory (out -> out.tmp)"),
    (SystemExit("unknown preset 'tiny'"), "error: unknown preset 'tiny'"),
    (SystemExit("error: already prefixed"), "error: already prefixed"),
    (InputError("the resumed run differs:\n  lr: saved 1, now 2\npass the saved values"),
     "error: the resumed run differs: lr: saved 1, now 2 pass the saved values"),
])
def test_a_refusal_is_one_line_and_exit_1(exc, line, monkeypatch, capsys):
    code, err = call(raising(exc), [], monkeypatch, capsys)
    assert code == 1 and err == line + "\n"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback_and_is_not_passed_on(how, monkeypatch, capsys):
    seen = []

    def main():
        seen.append(list(sys.argv[1:]))
        raise InputError("bad input")
    if how == "env":
        monkeypatch.setenv("R3_DEBUG", "1")
    code, err = call(main, ["--steps", "3", "--debug"] if how == "flag" else ["--steps", "3"], monkeypatch, capsys)
    assert code == 1 and "Traceback (most recent call last)" in err and err.endswith("error: bad input\n")
    assert seen == [["--steps", "3"]]


@pytest.mark.parametrize("exc", [ZeroDivisionError("bug"), ValueError("a torch shape bug"), KeyError("k"),
                                 RuntimeError("size mismatch"), OSError("no file named")])
def test_a_bug_keeps_its_traceback(exc, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["prog"])
    with pytest.raises(type(exc)):
        run_main(raising(exc))


@pytest.mark.parametrize("code", [0, 2, None])
def test_ordinary_exits_pass_through(code, monkeypatch, capsys):
    got, err = call(raising(SystemExit(code)), [], monkeypatch, capsys)
    assert got == code and err == ""


def test_a_write_error_a_stop_and_a_bare_ctrl_c_are_one_line_each(monkeypatch, capsys):
    import errno
    from r3.errors import Stopped, WriteError
    code, err = call(raising(WriteError(errno.ENOSPC, "error: cannot write run/ckpt.pt: No space left on device")),
                     [], monkeypatch, capsys)
    assert code == 1 and err == "error: cannot write run/ckpt.pt: No space left on device\n"
    code, err = call(raising(Stopped("stopped by SIGTERM at a step boundary: ...", 143)), [], monkeypatch, capsys)
    assert code == 143 and err == "stopped by SIGTERM at a step boundary: ...\n"
    code, err = call(raising(Stopped("", 143)), [], monkeypatch, capsys)  # a rank that does not print
    assert code == 143 and err == ""
    code, err = call(raising(KeyboardInterrupt()), [], monkeypatch, capsys)  # before train.py's handlers
    assert code == 130 and err == "stopped by SIGINT (Ctrl-C)\n"


def test_run_main_returns_what_main_returns(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["prog"])
    assert run_main(lambda: {"ok": 1}) == {"ok": 1}


@pytest.mark.parametrize("cmd, line", [
    (["train.py", "--task", "cipher:99-3"], "error: bad length range in task 'cipher:99-3': need 1 <= MIN <= MAX"),
    (["rollout.py", "--out", "rollout.py"], "error: 'rollout.py' is a file; a rollout batch is a folder"),
    (["-m", "r3.check", "--rollouts", "nowhere", "--preset", "toy"], "error: rollout folder 'nowhere' does not exist"),
    (["-m", "r3.inspect", "nowhere"], "error: nowhere does not exist"),
    (["-m", "r3.plots", "nowhere"], "error: nowhere: no metrics.jsonl (or it is empty)"),
    (["-m", "r3.serve", "--model", "nowhere", "--weights-root", "tests"],
     "error: --model nowhere: model folder 'nowhere' does not exist"),
    (["-m", "experiments.mismatch", "--task", "cipher:99-3", "--out", "nowhere"],
     "error: bad length range in task 'cipher:99-3': need 1 <= MIN <= MAX"),
])
def test_every_entry_point_prints_one_line(cmd, line):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("R3_DEBUG", None)
    r = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 1 and r.stderr == line + "\n", r.stderr[-2000:]
    r = subprocess.run([sys.executable, *cmd, "--debug"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 1 and "Traceback" in r.stderr and r.stderr.endswith(line + "\n"), r.stderr[-2000:]
    assert not os.path.exists(os.path.join(ROOT, "nowhere"))


def test_the_route_checker_refuses_a_missing_folder_before_building_a_warm_up(tmp_path, monkeypatch, capsys):
    from r3.tools import check
    built = []
    monkeypatch.setattr(check, "load_checker_model", lambda args: built.append(args) or 1 / 0)
    with pytest.raises(SystemExit) as e:
        run_main(lambda: check.main(["--rollouts", str(tmp_path / "nowhere"), "--preset", "toy"]))
    assert e.value.code == 1
    assert capsys.readouterr().err == f"error: rollout folder '{tmp_path / 'nowhere'}' does not exist\n"
    assert built == []
