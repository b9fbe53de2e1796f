"""What this proves: --loss seq_is is the sequence-level importance-weighted policy gradient: its gradient with respect
to each token's log-prob equals the hand-computed -w(y)·A/n_tokens (w from the engine's log-probs, not
differentiated), tis truncates w at C, mis zeroes the rows outside [1/C, C] (even where w overflowed), and its
telemetry (effective sample size, largest log w, Var[log w]) matches a direct computation; train.py runs it with TIS
against the engine."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from r3.train.grpo import loss_denominator, policy_loss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def batch():
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 1]], dtype=torch.bool)
    logp = (-torch.rand(4, 4, generator=g) * 2).requires_grad_()
    rollout = logp.detach() + torch.tensor([[0.3, -0.2, 0.4, 9.0], [-0.5, -0.6, 9.0, 9.0], [0.1, 0.0, -0.1, 0.2],
                                            [9.0, 0.05, 0.05, 0.05]])  # off-mask entries must not matter
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])
    return logp, rollout, adv, mask


@pytest.mark.parametrize("kind", ["none", "tis", "mis"])
def test_gradient_by_hand(kind):
    logp, rollout, adv, mask = batch()
    cap = 1.5
    loss, m = policy_loss(logp, rollout, adv, mask, loss="seq_is", rollout_logp_BT=rollout, is_correction=kind,
                          is_cap=cap)
    loss.backward()
    lp = logp.detach()
    log_w = [float(sum(lp[b, t] - rollout[b, t] for t in range(4) if mask[b, t])) for b in range(4)]
    n = int(mask.sum())
    for b in range(4):
        w = math.exp(log_w[b])
        if kind == "tis":
            w = min(w, cap)
        if kind == "mis" and abs(log_w[b]) > math.log(cap):
            w = 0.0
        for t in range(4):
            expect = -w * float(adv[b]) / n if mask[b, t] else 0.0
            assert math.isclose(float(logp.grad[b, t]), expect, rel_tol=1e-5, abs_tol=1e-7), (kind, b, t)
    ws = [math.exp(x) for x in log_w]
    assert math.isclose(m["seq_is/ess_frac"], sum(ws) ** 2 / sum(w * w for w in ws) / 4, rel_tol=1e-6)
    assert math.isclose(m["seq_is/max_log_w"], max(log_w), rel_tol=1e-6)
    mean = sum(log_w) / 4
    assert math.isclose(m["seq_is/var_log_w"], sum((x - mean) ** 2 for x in log_w) / 4, rel_tol=1e-5)
    assert loss_denominator(logp, rollout, mask, loss="seq_is", is_correction=kind) == n
    if kind == "mis":
        assert m["is/masked_frac"] == sum(abs(x) > math.log(cap) for x in log_w) / 4


def test_an_overflowing_weight_is_dropped_by_mis_and_leaves_the_telemetry_finite():
    """log w = 400 overflows w to inf in fp32 (and w² in fp64): MIS drops that row and the loss stays finite, a row
    with A = 0 adds nothing even at w = inf, and the ESS still reads two effective rows of three."""
    logp = torch.zeros(3, 2, requires_grad=True)
    rollout = torch.tensor([[-200.0, -200.0], [-200.0, -200.0], [0.1, 0.0]])  # log w = 400, 400, -0.1
    adv, mask = torch.tensor([1.0, 0.0, -1.0]), torch.ones(3, 2, dtype=torch.bool)
    loss, m = policy_loss(logp, rollout, adv, mask, loss="seq_is", rollout_logp_BT=rollout, is_correction="mis",
                          is_cap=2.0)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all()
    assert torch.equal(logp.grad[:2], torch.zeros(2, 2))  # dropped (row 0), A = 0 (row 1)
    assert math.isclose(float(logp.grad[2, 0]), math.exp(-0.1) / 6, rel_tol=1e-6)  # -w·A/n, kept: |log w| < log 2
    assert math.isclose(m["seq_is/ess_frac"], 2 / 3, rel_tol=1e-6)  # two equal dominant weights: ESS 2 of 3 rows
    assert m["seq_is/max_log_w"] == 400.0
    loss, _ = policy_loss(logp, rollout, adv, mask, loss="seq_is", rollout_logp_BT=rollout, is_correction="none")
    assert not math.isfinite(loss.item())  # untruncated, an infinite weight is an infinite loss: the guard's to see


def test_train_py_runs_seq_is(tmp_path):
    args = ["--steps", "2", "--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task", "sort:3-4",
            "--val-every", "0", "--no-plot", "--quiet", "--loss", "seq_is", "--mini-steps", "1", "--old-logp", "engine",
            "--is-correction", "tis", "--rollout-dtype", "fp8", "--out", "run"]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]

    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert all(0 < r["seq_is/ess_frac"] <= 1 + 1e-9 and r["seq_is/var_log_w"] >= 0 for r in rows)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args[:-6], "--is-correction", "icepop",
                        "--out", "bad"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "tis or mis" in r.stderr
