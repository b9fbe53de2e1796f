"""What this proves: --mismatch-every N changes only what is logged: the training trajectory (rewards, losses, grad
norms, held-out accuracy) is bit-identical to logging every step, in every replay mode; the measured steps log the
same mismatch numbers and the others None; the staleness flip rate is logged from mini-step 1 on, and the largest
|log ratio| is exactly 0 where the ratio is exactly 1 (one mini-step, the trainer's π_old)."""
import json
import os
import subprocess
import sys

import pytest

from r3.train.metrics import MISMATCH_KEYS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--steps", "4", "--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task", "sort:3-4",
        "--val-every", "0", "--eval-every", "2", "--eval-prompts", "2", "--dump-every", "0", "--no-plot", "--quiet"]
TRAJECTORY = ("reward", "loss", "grad_norm", "eval/accuracy", "grpo/ratio_mean", "grpo/max_abs_log_ratio")


def run(tmp_path, name, *flags):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, *flags, "--out", name], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(tmp_path / name / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("mode", [["--replay", "none", "--old-logp", "engine"], ["--r3", "--old-logp", "engine"],
                                  ["--replay", "r2"], ["--replay", "none"]])
def test_cadence_changes_only_the_logs(tmp_path, mode):
    every = run(tmp_path, "every", *mode, "--mini-steps", "2", "--rollout-dtype", "fp8")
    sparse = run(tmp_path, "sparse", *mode, "--mini-steps", "2", "--rollout-dtype", "fp8", "--mismatch-every", "3")
    assert len(every) == len(sparse) == 4
    for a, b in zip(every, sparse):
        assert all(a.get(k) == b.get(k) for k in TRAJECTORY), (a, b)
        measured = a["step"] % 3 == 0
        for k in MISMATCH_KEYS:
            assert b[k] == (a[k] if measured else None), (k, a["step"])
        assert b["staleness/router_flip_rate"] == (a["staleness/router_flip_rate"] if measured else None)
        assert a["staleness/router_flip_rate"] is not None and 0 <= a["staleness/router_flip_rate"] <= 1


def test_one_mini_step_has_no_staleness_and_ratio_one(tmp_path):
    rows = run(tmp_path, "m1", "--mini-steps", "1")  # trainer π_old: the only mini-step's ratio is exactly 1
    assert all(r["staleness/router_flip_rate"] is None and r["grpo/max_abs_log_ratio"] == 0.0 for r in rows)
    rows = run(tmp_path, "m1e", "--mini-steps", "1", "--old-logp", "engine", "--rollout-dtype", "fp8")
    assert all(r["grpo/max_abs_log_ratio"] > 0 for r in rows)  # against the engine's log-probs it is the mismatch
