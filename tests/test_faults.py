"""What this proves (issue 51): SIGINT, SIGTERM and SIGUSR1 end train.py at a step boundary with its checkpoint saved,
one line (the signal, the step ckpt.pt holds, the --resume command) and exit status 128 + the signal; a second
SIGINT stops at once, naming the last good checkpoint, its cut save leaving no temporary file; a write that fails
(ENOSPC stand-in, or a real EFBIG from the kernel's file-size limit, torch's own writer included) is one `error:`
line naming the file and what was kept, and leaves nothing partial, for the checkpoint, metrics.jsonl, a guard
snapshot, a JSON file, a rollout folder; the guard keeps at most --guard-snapshots snapshots; and after each stop the
command the line gives resumes to metrics identical to an uninterrupted run. Faults are injected at known points
(tests/stopped.py), never timed."""
import errno
import json
import os
import re
import resource
import shlex
import signal
import subprocess
import sys

import pytest
import torch

from r3.errors import WriteError
from r3.runs.io import append_jsonl, atomic_write, atomic_write_json
from r3.runs.runfolder import snapshots_to_keep
from stopped import STOPPED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the guard fires at every even step: kl_surge on the steps that measure the mismatch (--mismatch-every 2), absent
# on the others, so each even step is an onset and saves a snapshot
ARGS = ["--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task", "sort:3-4", "--val-every",
        "0", "--eval-every", "0", "--dump-every", "0", "--no-plot", "--quiet", "--save-every", "2",
        "--mismatch-every", "2", "--guard-kl-max", "1e-9"]
STEPS = ["--steps", "8"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)


def train(argv, cwd, stop=None):
    """train.py `argv` in cwd (through tests/stopped.py K MODE when `stop` is (K, MODE)); stderr without the
    progress bar and notes: the lines a user reads at the end."""
    cmd = [sys.executable, STOPPED, str(stop[0]), stop[1]] if stop else [sys.executable, os.path.join(ROOT, "train.py")]
    r = subprocess.run([*cmd, *argv], cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV)
    r.lines = [x.strip() for x in r.stderr.replace("\r", "\n").split("\n")
               if x.strip() and "it/s]" not in x and "%|" not in x and not x.startswith(("note:", "collapse guard:"))]
    return r


def metrics(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k != "step_time"} for line in f]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run every stopped one must match once resumed."""
    d = tmp_path_factory.mktemp("ref")
    r = train([*ARGS, *STEPS, "--out", "ref"], d)
    assert r.returncode == 0, r.stderr[-3000:]
    return metrics(d / "ref")


def go_on(line, cwd, reference):
    """Run the command the stop's line gives; the run's metrics must then be the reference's."""
    cmd = shlex.split(line.split("go on with: ")[1])
    assert cmd[0] == "python" and cmd[-1] == "--resume"
    r = subprocess.run([sys.executable, *cmd[1:]], cwd=cwd, capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert metrics(cwd / "run") == reference


def leftovers(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith((".tmp", ".old")))


@pytest.mark.parametrize("how, signum", [("int", signal.SIGINT), ("term", signal.SIGTERM), ("usr1", signal.SIGUSR1)])
def test_a_signal_ends_the_run_at_a_step_boundary_with_its_checkpoint(tmp_path, reference, how, signum):
    r = train([*ARGS, *STEPS, "--out", "run"], tmp_path, stop=(3, how))  # the signal in step 2 (the third)
    assert r.returncode == 128 + signum, r.stderr[-3000:]
    assert len(r.lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    name = signal.Signals(signum).name
    assert r.lines[0].startswith(f"stopped by {name} at a step boundary: run/ckpt.pt holds the state after step 2 "
                                 f"(3 steps done); go on with: python "), r.lines[0]
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["step"] == 3  # saved off the --save-every 2
    assert len(metrics(tmp_path / "run")) == 3 and leftovers(tmp_path / "run") == []
    assert not (tmp_path / "run" / "done.json").exists()  # a stopped run is not a finished one (experiments/sweep.py)
    go_on(r.lines[0], tmp_path, reference)


def test_a_second_ctrl_c_stops_at_once_and_names_the_last_good_checkpoint(tmp_path, reference):
    # SIGINT in step 3; the save after it (ckpt.pt at 4 steps) gets a second SIGINT once its temporary file is written
    r = train([*ARGS, *STEPS, "--out", "run"], tmp_path, stop=(4, "int2"))
    assert r.returncode == 130 and len(r.lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.lines[0].startswith("stopped at once by a second SIGINT: the step under way is lost; the last good "
                                 "checkpoint: run/ckpt.pt holds the state after step 1 (2 steps done); go on with: "), \
        r.lines[0]
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["step"] == 2
    assert leftovers(tmp_path / "run") == []  # the cut save's ckpt.pt.tmp is removed
    go_on(r.lines[0], tmp_path, reference)


@pytest.mark.parametrize("stop, lines, what, kept", [  # lines: metrics.jsonl's lines after the failure
    ((2, "fsize:ckpt.pt"), 4, "run/ckpt.pt: File too large [EFBIG] (the file-size limit, ulimit -f, is 64 bytes); "
     "it needs about", "the previous run/ckpt.pt is intact; the partial run/ckpt.pt.tmp is removed; run/ckpt.pt "
     "holds the state after step 1 (2 steps done)"),
    ((2, "full:ckpt.pt"), 4, "run/ckpt.pt: No space left on device [ENOSPC]; it needs about",
     "the previous run/ckpt.pt is intact; the partial run/ckpt.pt.tmp is removed; run/ckpt.pt holds the state after "
     "step 1 (2 steps done)"),
    ((4, "full:metrics.jsonl"), 3, "run/metrics.jsonl: No space left on device [ENOSPC]; it needs about",
     "run/metrics.jsonl is cut back to the"),
    ((4, "fsize:metrics.jsonl"), 3, "run/metrics.jsonl: File too large [EFBIG]", "run/metrics.jsonl is cut back to"),
    ((2, "full:collapse_step*.pt"), 3, "run/collapse_step2.pt: No space left on device [ENOSPC]; it needs about",
     "run/collapse_step2.pt was not written; the partial run/collapse_step2.pt.tmp is removed; run/ckpt.pt holds "
     "the state after step 1 (2 steps done)"),
], ids=["ckpt-efbig", "ckpt-enospc", "metrics-enospc", "metrics-efbig", "snapshot-enospc"])
def test_a_failed_write_is_one_line_and_leaves_nothing_partial(tmp_path, reference, stop, lines, what, kept):
    r = train([*ARGS, *STEPS, "--out", "run"], tmp_path, stop=stop)
    assert r.returncode == 1 and len(r.lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.lines[0].startswith(f"error: cannot write {what}") and kept in r.lines[0], r.lines[0]
    assert leftovers(tmp_path / "run") == []
    with open(tmp_path / "run" / "metrics.jsonl", "rb") as f:
        log = f.read()
    assert log.endswith(b"\n") and len(log.splitlines()) == lines  # whole lines only
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["step"] == 2
    if "collapse" in stop[1]:
        assert sorted(n for n in os.listdir(tmp_path / "run") if n.startswith("collapse")) == ["collapse_step0.pt"]
    go_on(r.lines[0], tmp_path, reference)


def onsets(rows):
    """The steps at which a symptom fired that was not firing a step earlier (the guard's `new`)."""
    return [m["step"] for i, m in enumerate(rows) if set(m["symptoms"]) - set(rows[i - 1]["symptoms"] if i else [])]


def test_the_guard_keeps_at_most_guard_snapshots_files(tmp_path):
    """50 steps, an onset at least every other step; --guard-snapshots 3 keeps the first and the latest 2, also
    across a stop and a resume; 0 keeps none; every onset is in metrics.jsonl and no number changes."""
    fifty = [*ARGS, "--steps", "50", "--save-every", "10"]
    r = train([*fifty, "--out", "run"], tmp_path, stop=(17, "term"))  # stopped after step 16 (an onset: saved)
    assert r.returncode == 143 and "holds the state after step 16 (17 steps done)" in r.lines[0], r.stderr[-3000:]
    snaps = lambda out: sorted(n for n in os.listdir(tmp_path / out) if n.startswith("collapse"))  # noqa: E731
    kept = lambda steps: sorted(f"collapse_step{s}.pt" for s in snapshots_to_keep(steps, 3))  # noqa: E731
    assert snaps("run") == kept(onsets(metrics(tmp_path / "run"))) and len(snaps("run")) == 3
    resumed = train([*fifty, "--out", "run", "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = metrics(tmp_path / "run")
    assert len(onsets(rows)) >= 25 and snaps("run") == kept(onsets(rows)) and len(snaps("run")) == 3
    assert [m["step"] for m in rows if "kl_surge" in m["symptoms"]] == list(range(0, 50, 2))  # every fire logged
    none = train([*fifty, "--out", "none", "--guard-snapshots", "0"], tmp_path)
    assert none.returncode == 0 and snaps("none") == []
    assert rows == metrics(tmp_path / "none")  # snapshots change no number


def test_under_torchrun_every_rank_stops_at_the_step_a_signal_reached_one_of_them(tmp_path):
    """Two gloo ranks (FSDP2); only rank 1 gets SIGTERM, in its 2nd step: rank 0 stops at the same step boundary
    (an all-reduce MAX of the stop flag), after the collective OUT/hf save; neither hangs."""
    from conftest import gloo_died, rank_errors
    from test_train_real import make_checkpoint
    make_checkpoint(tmp_path / "ckpt")
    (tmp_path / "qa.jsonl").write_text('{"prompt": "What is 2 plus 3 ?", "answer": "5"}\n')
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", STOPPED, "2",
           "term@1", "--model", "ckpt", "--task", "jsonl:qa.jsonl", "--r3", "--steps", "5", "--prompts-per-step", "4",
           "--group-size", "4", "--shards", "2", "--max-new-tokens", "6", "--logprob-chunk", "16", "--val-every", "0",
           "--fsdp-param-dtype", "fp32", "--no-plot", "--quiet", "--out", "run"]
    for _ in range(2):  # a gloo abort in the C++ layer is retried once (conftest.gloo_died)
        r = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
        if "stopped by" in r.stderr or not gloo_died(r.stderr):
            break
    ours = [x for x in r.stderr.splitlines() if x.startswith(("stopped", "error:"))]
    assert ours == ["stopped by SIGTERM at a step boundary: run/hf holds the weights after step 1 (2 steps done); "
                    "--resume is not supported under torchrun (no optimizer or RNG state is saved): start a new run "
                    "with --model run/hf"], rank_errors(r.stderr)
    # Each rank ends with 143 on its own, unless torchrun's agent, seeing the first rank gone, sends SIGTERM to the
    # other after it stopped at the boundary (the line above, the collective save and the metrics below show it did)
    # and before it exited: then that rank reads -15. Which rank exits first is the machine's timing, so either may.
    codes = dict(re.findall(r"rank\s+: (\d+) \(local_rank: \d+\)\n\s+exitcode\s+: (-?\d+)", r.stderr))
    assert set(codes) == {"0", "1"} and set(codes.values()) <= {"143", "-15"} and "143" in codes.values(), codes
    assert len(metrics(tmp_path / "run")) == 2 and (tmp_path / "run" / "hf" / "config.json").exists()
    assert not (tmp_path / "run" / "done.json").exists() and leftovers(tmp_path / "run") == []


def test_snapshots_to_keep_is_the_first_and_the_latest():
    assert snapshots_to_keep([0, 2, 4, 6, 8], 3) == [0, 6, 8] and snapshots_to_keep([8, 0, 2], 3) == [0, 2, 8]
    assert snapshots_to_keep([0, 2, 4], 1) == [0] and snapshots_to_keep([0, 2], 0) == []
    assert snapshots_to_keep([0, 2, 4, 6], 2) == [0, 6] and snapshots_to_keep([], 3) == []


def full_disk():
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def enospc_after(n):
    """A writer that writes `n` bytes of its file, then meets a full disk."""
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(b"x" * n)
        full_disk()
    return write


def bug(tmp):
    with open(tmp, "w") as f:
        f.write("x")
    return 1 / 0


def test_atomic_write_keeps_the_old_file_and_removes_its_temporary_copy(tmp_path):
    path = str(tmp_path / "args.json")
    atomic_write_json(path, {"lr": 1})
    with pytest.raises(WriteError) as e:
        atomic_write(path, enospc_after(100), need=300)
    assert str(e.value.strerror).startswith(f"error: cannot write {path}: No space left on device [ENOSPC]; it needs "
                                            f"about 300 bytes, 100 bytes were written, ")
    assert e.value.strerror.endswith(f"the previous {path} is intact; the partial {path}.tmp is removed")
    assert json.load(open(path)) == {"lr": 1} and os.listdir(tmp_path) == ["args.json"]
    with pytest.raises(WriteError, match="new.json was not written"):
        atomic_write(str(tmp_path / "new.json"), enospc_after(10))
    assert os.listdir(tmp_path) == ["args.json"]
    with pytest.raises(ZeroDivisionError):  # a bug is not a failed write: it passes through, the copy still removed
        atomic_write(path, bug)
    assert os.listdir(tmp_path) == ["args.json"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EIO])
def test_every_os_error_of_a_write_names_the_file_and_the_error(tmp_path, code):
    """A quota, a permission taken away (root, who runs these tests, ignores modes: raised here), an fsync's EIO."""
    def write(tmp):
        with open(tmp, "w") as f:
            f.write("partial")
        raise OSError(code, os.strerror(code), tmp)
    with pytest.raises(WriteError) as e:
        atomic_write(str(tmp_path / "run.json"), write)
    assert e.value.strerror.startswith(f"error: cannot write {tmp_path / 'run.json'}: {os.strerror(code)} "
                                       f"[{errno.errorcode[code]}]") and os.listdir(tmp_path) == []


def test_a_failed_append_cuts_the_log_back_to_its_whole_lines(tmp_path, monkeypatch):
    path = str(tmp_path / "metrics.jsonl")
    append_jsonl(path, {"step": 0})
    real = open

    def half_open(*a, **kw):
        f = real(*a, **kw)
        write = f.write
        f.write = lambda text: (write(text[:4]), f.flush(), full_disk())  # 4 bytes of the line, then ENOSPC
        return f
    monkeypatch.setattr("r3.runs.io.open", half_open, raising=False)
    with pytest.raises(WriteError, match="metrics.jsonl is cut back to the 12 bytes it held"):
        append_jsonl(path, {"step": 1})
    assert open(path).read() == '{"step": 0}\n'


def test_a_rollout_folder_write_cut_by_the_file_size_limit_keeps_the_old_batch(tmp_path):
    """rollout.py under `ulimit -f`: safetensors' own writer meets EFBIG; one line, the old batch loads bit for bit."""
    from r3.rollout.batch import load_batch
    args = [os.path.join(ROOT, "rollout.py"), "--preset", "toy", "--task", "sort", "--warmup-steps", "0",
            "--num-prompts", "2", "--group-size", "2", "--max-new-tokens", "4", "--no-mismatch", "--no-progress",
            "--out", "ro"]
    assert subprocess.run([sys.executable, *args], cwd=tmp_path, env=ENV, capture_output=True).returncode == 0
    old = load_batch(str(tmp_path / "ro"))
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))  # noqa: E731  (ulimit -f 1)
    r = subprocess.run([sys.executable, *args, "--seed", "1"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                       preexec_fn=limit, timeout=300)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith(
        "error: cannot write ro: File too large [EFBIG] (the file-size limit, ulimit -f, is 1,024 bytes)"), r.stderr
    assert r.stderr.rstrip().endswith("the previous ro is intact; the partial ro.tmp is removed")
    assert sorted(os.listdir(tmp_path)) == ["ro"]
    new = load_batch(str(tmp_path / "ro"))
    assert new.meta == old.meta and torch.equal(new.tokens, old.tokens)
