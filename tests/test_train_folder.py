"""What this proves (train.py's run folder, issues 10 and 11): a resume with different run-defining flags is refused
naming each field unless allowed (and then recorded); --overwrite removes the old run before the new one writes; a
second process on the same folder is refused naming the holder; a torn last metrics line is repaired on resume; a
prompt the model cannot hold is refused before the warm-up; the run writes held-out accuracy, provenance and sample
dumps whose prompts all come from the training split."""
import json
import os
import signal
import subprocess
import sys

from r3.rollout.batch import load_batch
from r3.tasks.tasks import prompt_split
from stopped import held

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task", "sort:3-4",
        "--val-every", "0", "--eval-prompts", "8", "--eval-samples", "2", "--no-plot", "--quiet"]


def run(args, cwd):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def lines(path):
    return [json.loads(x) for x in open(path)]


def test_resume_checks_the_run_defining_flags(tmp_path):
    assert run(["--steps", "2", "--r3", "--out", "run"], tmp_path).returncode == 0
    r = run(["--steps", "4", "--out", "run", "--resume", "--lr", "1e-3"], tmp_path)  # no --r3, another lr
    assert r.returncode != 0 and "replay: saved 'r3', now 'none'" in r.stderr and "lr: saved 0.0003" in r.stderr
    assert len(lines(tmp_path / "run" / "metrics.jsonl")) == 2  # refused before anything was touched
    r = run(["--steps", "4", "--r3", "--out", "run", "--resume", "--lr", "1e-3", "--allow-change", "lr"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert lines(tmp_path / "run" / "resumes.jsonl") == [dict(step=2, changes=dict(lr=[0.0003, 0.001]))]
    assert [m["step"] for m in lines(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2, 3]
    assert json.loads((tmp_path / "run" / "args.json").read_text())["lr"] == 1e-3
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())  # the first process, listed by the second
    assert [seg["commit"] for seg in prov["segments"]] == [prov["commit"]] and prov["segments"][0]["finished"]


def test_overwrite_removes_the_old_run_before_writing(tmp_path):
    assert run(["--steps", "2", "--out", "run"], tmp_path).returncode == 0
    assert (tmp_path / "run" / "ckpt.pt").exists() and (tmp_path / "run" / "done.json").exists()
    mpath = tmp_path / "run" / "metrics.jsonl"
    p = held([*TINY, "--steps", "30", "--save-every", "100", "--out", "run", "--overwrite"], tmp_path)
    assert json.loads((tmp_path / "run" / "args.json").read_text())["steps"] == 30 and len(lines(mpath)) == 1
    p.send_signal(signal.SIGKILL)  # the new run, held after its first step (tests/stopped.py), dies there
    p.wait()
    assert not (tmp_path / "run" / "ckpt.pt").exists() and not (tmp_path / "run" / "done.json").exists()
    r = run(["--steps", "2", "--out", "run", "--resume"], tmp_path)  # nothing of the old run to continue from
    assert r.returncode == 0 and "starting from scratch" in r.stdout
    assert [m["step"] for m in lines(mpath)] == [0, 1]


def test_second_process_on_the_same_folder_is_refused(tmp_path):
    mpath = tmp_path / "run" / "metrics.jsonl"
    p = held([*TINY, "--steps", "200", "--out", "run"], tmp_path)  # holds the folder until killed
    try:
        assert len(lines(mpath)) == 1
        r = run(["--steps", "200", "--out", "run", "--resume"], tmp_path)
        assert r.returncode != 0 and str(p.pid) in r.stderr, r.stderr[-2000:]
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    r = run(["--steps", "2", "--out", "run", "--overwrite"], tmp_path)  # the OS released the killed run's lock
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_torn_last_metrics_line_is_repaired_on_resume(tmp_path):
    assert run(["--steps", "2", "--save-every", "1", "--out", "run"], tmp_path).returncode == 0
    mpath = tmp_path / "run" / "metrics.jsonl"
    with open(mpath, "a") as f:
        f.write('{"step": 2, "reward": 0.')  # a kill mid-line
    r = run(["--steps", "3", "--out", "run", "--resume"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [m["step"] for m in lines(mpath)] == [0, 1, 2]


def test_a_prompt_longer_than_the_model_is_refused_before_the_warmup(tmp_path):
    r = run(["--steps", "1", "--task", "sort:1-300", "--out", "run"], tmp_path)
    assert r.returncode != 0 and "need 603 positions; the model has 256" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / ".cache").exists()


def test_heldout_accuracy_provenance_and_dumps(tmp_path):
    r = run(["--steps", "3", "--eval-every", "2", "--dump-every", "1", "--r3", "--out", "run"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = lines(tmp_path / "run" / "metrics.jsonl")
    assert [("eval/accuracy" in m) for m in rows] == [False, True, True]  # every 2 steps and at the end
    assert all(0 <= m["eval/accuracy_greedy"] <= 1 and m["eval/n"] == 8 for m in rows[1:])
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    for k in ("commit", "dirty", "torch", "python", "threads", "machine", "wall_s", "argv"):
        assert k in prov, k
    assert "segments" not in prov  # one process, nothing resumed
    for step in range(3):
        b = load_batch(str(tmp_path / "run" / "samples" / f"step{step}"))
        prompts = [b.tokens[i][b.attn_mask[i] & ~b.response_mask[i]].tolist() for i in range(len(b))]
        assert prompts and all(prompt_split(p) == "train" for p in prompts)
