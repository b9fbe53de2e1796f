"""What this proves: train.py runs in every replay mode as a real subprocess, writes every required metric, and a
run killed with SIGKILL (right after a metrics line, or inside a checkpoint save) resumes to bit-identical metrics
(step_time aside) on CPU."""
import json
import os
import signal
import subprocess
import sys

import pytest

from stopped import STOPPED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--steps", "4", "--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task", "sort:3-4",
        "--val-every", "2", "--val-prompts", "2", "--no-plot", "--quiet"]
REQUIRED = ["step", "reward", "kl", "kl_full", "extreme_frac", "router_flip_rate", "token_flip_rate",
            "flips_per_token", "entropy", "grad_norm", "response_length", "clip_frac", "step_time"]


def run(args, cwd, **kw):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, **kw)


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("mode", [["--replay", "none"], ["--replay", "r2", "--mini-steps", "2"], ["--r3"],
                                  ["--dense"], ["--r3", "--loss", "gspo", "--is-correction", "tis"]])
def test_smoke_each_mode(mode, tmp_path):
    r = run([*TINY, *mode, "--out", "run"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = metrics(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in rows] == [0, 1, 2, 3]
    for m in rows:
        assert set(REQUIRED) <= set(m), set(REQUIRED) - set(m)
        dense = "--dense" in mode
        assert (m["router_flip_rate"] is None) == dense
        assert m["kl"] >= 0 and m["kl_full"] >= -1e-9 and 0 <= m["reward"] <= 1
    if "--r3" in mode:
        assert rows[1]["val/kl"] is not None


def test_existing_run_is_not_overwritten(tmp_path):
    assert run([*TINY, "--steps", "1", "--out", "run"], tmp_path).returncode == 0
    r = run([*TINY, "--steps", "1", "--out", "run"], tmp_path)
    assert r.returncode != 0 and "--resume" in r.stderr


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    args = [*TINY, "--steps", "10", "--save-every", "1", "--r3", "--rollout-dtype", "fp8"]
    assert run([*args, "--out", "ref"], tmp_path).returncode == 0
    ref = metrics(tmp_path / "ref" / "metrics.jsonl")
    # killed by itself at a known point (tests/stopped.py), not by a timer racing the run: right after its 3rd
    # metrics line (ckpt.pt one step behind the log), and inside its 6th save (ckpt.pt.tmp written, not renamed)
    for kill_after, how in ((3, "kill"), (6, "save")):
        out = tmp_path / f"killed{kill_after}"
        k = subprocess.run([sys.executable, STOPPED, str(kill_after), how, *args, "--out", out.name], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert k.returncode == -signal.SIGKILL, k.stderr[-3000:]
        mpath = out / "metrics.jsonl"
        assert len(metrics(mpath)) == kill_after and (out / "ckpt.pt.tmp").exists() == (how == "save")
        r = run([*args, "--out", out.name, "--resume"], tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        got = metrics(mpath)
        assert [m["step"] for m in got] == list(range(10))
        for a, b in zip(ref, got):
            a, b = dict(a), dict(b)
            a.pop("step_time"), b.pop("step_time")
            assert a == b, (a["step"], {k: (a[k], b[k]) for k in a if a[k] != b.get(k)})


def _disk_rollouts(tmp_path, drop_routes_in=None):
    """Two rollout folders from the same warmed-up toy model that train.py will build (same flags, same cache)."""
    import torch

    from r3.rollout.batch import save_batch
    from r3.rollout.engine import Engine
    from r3.model.model import PRESETS
    from r3.tasks.tasks import EOS, PAD, make_task
    from r3.train.warmup import warmed_up_model
    task = make_task("sort:3-4")
    model, _ = warmed_up_model(PRESETS["toy"], task, "sort:3-4", steps=3, seed=0, progress=False,
                               cache_dir=str(tmp_path / ".cache" / "warmup"))
    engine = Engine(model, "bf16")
    g = torch.Generator().manual_seed(0)
    for i in range(2):
        ex = task.sample(3, g)
        b = engine.generate([e.prompt for e in ex], max_new_tokens=task.max_new_tokens, eos_ids=(EOS,), pad_id=PAD,
                            group_size=2, generator=g)
        b.rewards = torch.rand(len(b), generator=g)
        if i == drop_routes_in:
            b.routes = None
        save_batch(b, str(tmp_path / "rollouts" / f"step{i}"))


def test_train_from_rollouts_on_disk_with_r3(tmp_path):
    _disk_rollouts(tmp_path)
    r = run([*TINY, "--steps", "3", "--r3", "--rollouts", "rollouts", "--out", "run"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 3 and rows[0]["exact"] is None and rows[0]["router_flip_rate"] is not None


def test_r3_refuses_rollouts_without_routes_naming_the_sample(tmp_path):
    _disk_rollouts(tmp_path, drop_routes_in=1)
    r = run([*TINY, "--steps", "3", "--r3", "--rollouts", "rollouts", "--out", "run"], tmp_path)
    assert r.returncode != 0
    assert "step1" in r.stderr and "no routes" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()
    r = run([*TINY, "--steps", "2", "--rollouts", "rollouts", "--out", "run2"], tmp_path)  # no replay: allowed
    assert r.returncode == 0, r.stderr[-2000:]


def test_replay_modes_route_the_update_as_documented(tmp_path):
    """R2 at one mini-step replays the trainer's own routes, so it is *exactly* no replay; R3 replays the engine's
    routes, so on the same first batch (same seeds) it removes the routing part of the mismatch."""
    args = [*TINY, "--steps", "2", "--mini-steps", "1", "--rollout-dtype", "fp8", "--prompts-per-step", "8",
            "--group-size", "4", "--val-every", "0"]
    rows = {}
    for mode in ("none", "r2", "r3"):
        r = run([*args, "--replay", mode, "--out", mode], tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        rows[mode] = metrics(tmp_path / mode / "metrics.jsonl")
    for a, b in zip(rows["none"], rows["r2"]):
        a, b = dict(a), dict(b)
        a.pop("step_time"), b.pop("step_time")
        assert a == b
    none0, r30 = rows["none"][0], rows["r3"][0]
    assert none0["reward"] == r30["reward"] and none0["router_flip_rate"] == r30["router_flip_rate"] > 0
    assert r30["kl"] < none0["kl"]


def test_fidelity_changes_no_other_metric_and_is_exact_for_an_fp32_arm(tmp_path):
    """--fidelity-every logs fidelity/* and leaves every other metric and the weights bit-identical; an arm with an
    fp32 engine and no replay takes exactly the on-policy gradient (cos 1, rel_err 0)."""
    base = [*TINY, "--r3", "--rollout-dtype", "fp8"]
    assert run([*base, "--out", "off"], tmp_path).returncode == 0
    r = run([*base, "--fidelity-every", "2", "--out", "on"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    strip = lambda rows: [{k: v for k, v in m.items() if k != "step_time" and not k.startswith("fidelity/")}  # noqa
                          for m in rows]
    on = metrics(tmp_path / "on" / "metrics.jsonl")
    assert strip(on) == strip(metrics(tmp_path / "off" / "metrics.jsonl"))
    assert [("fidelity/cos" in m) for m in on] == [True, False, True, False]
    assert -1 <= on[0]["fidelity/cos"] <= 1 and on[0]["fidelity/rel_err"] >= 0
    r = run([*TINY, "--rollout-dtype", "fp32", "--fidelity-every", "2", "--out", "oracle"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    m = metrics(tmp_path / "oracle" / "metrics.jsonl")[0]
    assert m["fidelity/rel_err"] == 0 and abs(m["fidelity/cos"] - 1) < 1e-9 and m["fidelity/same_rows"] == 1
