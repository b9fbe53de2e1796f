"""What this proves (issue 50): with --rollout-lag K the engine samples step t with the trainer's weights from the start
of step t − K, cast as the engine casts them (the first K steps with the initial weights), and the batch R3 replays
carries the routes that stale engine chose (the step resampled by a fresh engine at those weights gives the same
tokens, log-probs and routes); the FIFO holds K snapshots and no more; K = 0 logs every metric of a run without the
flag, bit for bit; a run with K = 2 killed and resumed, or stopped by the collapse guard and resumed, logs the
uninterrupted run's metrics bit for bit (the FIFO is in ckpt.pt), and a checkpoint without a fitting FIFO is
refused; a server engine, --rollouts and K < 0 are refused in one line before any work; under torchrun (2 gloo
processes, FSDP2) a lagged run logs what one process logs, bit for bit."""
import copy
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

import train
from r3.errors import run_main
from r3.model.model import ModelConfig, build_model
from r3.rollout.engine import Engine
from r3.runs.checkpoint import CheckpointFileError
from r3.train.lag import WeightLag, lagged_sync, snapshot
from stopped import STOPPED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--steps", "4", "--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task", "sort:3-4",
        "--val-every", "2", "--val-prompts", "2", "--no-plot", "--quiet"]


def run(args, cwd):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))


def metrics(path, drop=("step_time",)):
    with open(path) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in f]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def tiny_model(seed=0):
    return build_model(ModelConfig(vocab_size=16, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=8, moe_intermediate_size=8, num_experts=4,
                                   num_experts_per_tok=2, max_position_embeddings=32), seed=seed).init_weights(seed)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_fifo_serves_the_weights_of_k_steps_ago_and_holds_k(k):
    """The seam train.py calls after each update: `lagged_sync` at step t leaves the engine holding exactly what a
    fresh fp8 engine of the trainer's weights at the start of step t + 1 − K holds (step 0's for the first K)."""
    model = tiny_model()
    engine, history = Engine(model, "fp8"), []
    lag = WeightLag(k, engine)
    for step in range(6):
        history.append(copy.deepcopy(model))  # the trainer's weights at the start of `step`
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))  # the update
        lagged_sync(model, engine, None, lag, step)
        served = max(0, step + 1 - k)  # the weights the engine samples step + 1 with
        assert same(snapshot(engine), snapshot(Engine(history[served], "fp8"))), (k, step)
        assert not same(snapshot(engine), snapshot(Engine(model, "fp8")))  # the test can fail: K = 0 would
        assert lag.lag(step + 1) == step + 1 - served and len(lag.queue) == k  # bounded: K snapshots, never more
    with pytest.raises(ValueError):
        WeightLag(0, engine)


def test_a_checkpointed_fifo_round_trips_and_a_bad_one_is_refused(tmp_path):
    model = tiny_model()
    engine = Engine(model, "bf16")
    lag = WeightLag(2, engine)
    for step in range(3):
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        lagged_sync(model, engine, None, lag, step)
    torch.save(dict(extra=dict(rollout_lag=lag.state_dict())), tmp_path / "c.pt")
    state = torch.load(tmp_path / "c.pt", weights_only=True)["extra"]["rollout_lag"]
    back = WeightLag(2, Engine(model, "bf16"))
    back.load_state_dict(state, engine, "c.pt")
    assert [s for s, _ in back.queue] == [2, 3] and back.serving[0] == 1
    assert all(same(a[1], b[1]) for a, b in zip(back.queue, lag.queue)) and same(back.serving[1], lag.serving[1])
    for bad in (None, dict(state, k=3), dict(state, weights=state["weights"][:1]),
                dict(state, weights=[{**state["weights"][0], "lm_head.weight": torch.zeros(1)}] * 2)):
        with pytest.raises(CheckpointFileError, match="rollout-lag"):
            back.load_state_dict(bad, engine, "c.pt")
    nan = {k: v.clone() for k, v in state["weights"][1].items()}
    next(iter(nan.values())).fill_(float("nan"))
    with pytest.raises(CheckpointFileError, match="non-finite"):
        back.load_state_dict(dict(state, weights=[state["weights"][0], nan]), engine, "c.pt")


@pytest.mark.parametrize("k", [1, 2])
def test_the_engine_samples_step_t_with_the_weights_of_step_t_minus_k(k, tmp_path, monkeypatch):
    """End to end (train.main in this process): at each step's collect the engine's weights equal those of a fresh
    engine of the trainer's weights recorded at the start of step max(0, t − K); that engine, given the step's
    generator state, samples the same tokens, log-probs and routes, so the batch R3 replays is the stale engine's."""
    monkeypatch.chdir(tmp_path)
    seen, collect = [], train.collect

    def recording(run, step, measure=True):
        trainer = copy.deepcopy(run.model)
        engine, gens = snapshot(run.engine), {n: g.get_state() for n, g in run.gens.items()}
        rollouts = collect(run, step, measure)
        seen.append(dict(trainer=trainer, engine=engine, gens=gens, rollouts=rollouts, run=run, measure=measure))
        return rollouts
    monkeypatch.setattr(train, "collect", recording)
    train.main([*TINY, "--r3", "--rollout-dtype", "fp8", "--lr", "3e-3", "--rollout-lag", str(k), "--out", "run"])
    assert [m["staleness/rollout_lag"] for m in metrics(tmp_path / "run" / "metrics.jsonl")] == \
        [min(t, k) for t in range(4)]
    for t, s in enumerate(seen):
        stale = Engine(seen[max(0, t - k)]["trainer"], "fp8")
        assert same(s["engine"], snapshot(stale)), t
        if t >= k:  # the test can fail: the trainer's weights at t cast to other engine weights
            assert not same(s["engine"], snapshot(Engine(s["trainer"], "fp8"))), t
        run_ = s["run"]
        for n, g in run_.gens.items():
            g.set_state(s["gens"][n])
        run_.engine = stale
        again = collect(run_, t, s["measure"])[0].batch
        b = s["rollouts"][0].batch
        assert torch.equal(again.tokens, b.tokens) and torch.equal(again.rollout_logp, b.rollout_logp), t
        assert b.routes is not None and torch.equal(again.routes, b.routes), t


@pytest.mark.parametrize("arm", [["--r3", "--rollout-dtype", "fp8", "--mini-steps", "2"],
                                 ["--replay", "none", "--old-logp", "engine"]])
def test_lag_zero_logs_every_metric_of_a_run_without_the_flag(arm, tmp_path):
    for name, extra in (("plain", []), ("lag0", ["--rollout-lag", "0"])):
        r = run([*TINY, *arm, *extra, "--out", name], tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
    a, b = metrics(tmp_path / "plain" / "metrics.jsonl"), metrics(tmp_path / "lag0" / "metrics.jsonl")
    assert len(a) == 4 and a == b  # every key and value, step_time aside; no staleness/rollout_lag key at K = 0
    assert "staleness/rollout_lag" not in a[0]


def test_a_killed_lagged_run_resumes_bit_identically(tmp_path):
    args = [*TINY, "--steps", "6", "--save-every", "1", "--r3", "--rollout-dtype", "fp8", "--lr", "3e-3",
            "--rollout-lag", "2"]
    assert run([*args, "--out", "ref"], tmp_path).returncode == 0
    k = subprocess.run([sys.executable, STOPPED, "3", "kill", *args, "--out", "killed"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert k.returncode == -signal.SIGKILL, k.stderr[-3000:]
    r = run([*args, "--out", "killed", "--resume"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ref, got = metrics(tmp_path / "ref" / "metrics.jsonl"), metrics(tmp_path / "killed" / "metrics.jsonl")
    assert [m["staleness/rollout_lag"] for m in got] == [0, 1, 2, 2, 2, 2]
    assert ref == got, [(a["step"], {x: (a[x], b.get(x)) for x in a if a[x] != b.get(x)}) for a, b in zip(ref, got)]
    # a changed lag on resume is refused, unless allowed: then the engine restarts from the trainer's weights
    r = run([*args, "--steps", "7", "--rollout-lag", "1", "--out", "killed", "--resume"], tmp_path)
    assert r.returncode == 1 and "rollout_lag" in r.stderr
    r = run([*args, "--steps", "8", "--rollout-lag", "1", "--allow-change", "rollout_lag", "--out", "killed",
             "--resume"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [m["staleness/rollout_lag"] for m in metrics(tmp_path / "killed" / "metrics.jsonl")][6:] == [0, 1]


def test_a_collapse_stop_keeps_the_lagged_engine_of_the_step_start(tmp_path):
    """--on-collapse stop saves the state the onset step started from, the engine's stale weights and the FIFO among
    it: resumed from there, the run logs what an uninterrupted run logs. The staleness itself trips the guard at step 1
    (the mismatch kl is ~5e-7 at step 0 and ~1e-4 at step 1 with K = 2)."""
    args = [*TINY, "--steps", "4", "--r3", "--rollout-lag", "2", "--on-collapse", "stop"]
    assert run([*args, "--out", "ref"], tmp_path).returncode == 0
    r = run([*args, "--guard-kl-max", "1e-5", "--out", "stopped"], tmp_path)
    assert r.returncode == 0 and "collapse guard: kl_surge at step 1" in r.stdout, r.stdout[-3000:]
    r = run([*args, "--out", "stopped", "--resume", "--allow-change", "guard_kl_max"], tmp_path)
    assert r.returncode == 0 and "resumed stopped at step 1" in r.stdout, r.stderr[-3000:]
    assert metrics(tmp_path / "ref" / "metrics.jsonl") == metrics(tmp_path / "stopped" / "metrics.jsonl")


@pytest.mark.parametrize("argv, words", [
    (["--rollout-lag", "-1"], "--rollout-lag must be >= 0, got -1"),
    (["--rollout-lag", "1", "--engine", "sglang:http://127.0.0.1:9"], "--rollout-lag delays the in-process engine"),
    (["--rollout-lag", "2", "--rollouts", "somewhere"], "--rollout-lag delays the in-process engine"),
])
def test_refusals_are_one_line_before_any_work(argv, words, tmp_path, capsys, monkeypatch):
    """Flag errors, as every flag error of train.py: one `error:` line, exit status 2 (argparse's), nothing written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, *argv, "--out", "run"])
    with pytest.raises(SystemExit) as e:
        run_main(train.main)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert e.value.code == 2 and len(lines) == 1 and "error: " in lines[0] and words in lines[0], err
    assert os.listdir(tmp_path) == []


def test_two_process_fsdp_lagged_run_matches_one_process(tmp_path):
    from test_train_real import make_checkpoint, train as launch
    make_checkpoint(tmp_path / "ckpt")
    rows = [dict(prompt="What is 2 plus 3 ?", answer="5"), dict(prompt="What is 3 plus 4 ?", answer="7")] * 2
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--model", str(tmp_path / "ckpt"), "--task", f"jsonl:{tmp_path / 'qa.jsonl'}", "--r3", "--steps", "3",
              "--prompts-per-step", "4", "--group-size", "4", "--shards", "2", "--max-new-tokens", "6",
              "--logprob-chunk", "16", "--lr", "3e-3", "--lr-warmup", "1", "--rollout-dtype", "fp8",
              "--val-every", "0", "--fsdp-param-dtype", "fp32", "--no-plot", "--quiet", "--rollout-lag", "1"]
    one = launch([*common, "--out", "one"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    two = launch([*common, "--out", "two"], tmp_path, nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = metrics(tmp_path / "one" / "metrics.jsonl"), metrics(tmp_path / "two" / "metrics.jsonl")
    assert [m["staleness/rollout_lag"] for m in a] == [0, 1, 1] and a == b
