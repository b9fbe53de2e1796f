"""What this proves: the routing-mismatch dial (--router-levels N) rounds the engine's router weight, and only it, to
an N-point grid per row within its bound, leaves the trainer untouched, moves the engine's routes more as N falls,
and is refused where it makes no sense; a start-matched warm-up (--warmup-until) stops at the first probe that
reaches its target (or at its cap), records what it did, and is cached under its own key; --eval-trainer logs the
trainer's fp32 greedy accuracy beside the engine's; an old run saved before these flags existed still resumes."""
import json
import os
import subprocess
import sys

import pytest
import torch

from r3.train.config import TrainConfig, parse
from r3.rollout.engine import Engine
from r3.train.evaluate import evaluate, heldout_examples
from r3.train.metrics import flip_stats
from r3.model.model import ModelConfig, build_model
from r3.model.quant import router_grid
from r3.tasks.tasks import EOS, PAD, make_task
from r3.train.warmup import preset_config, probe_reward, warmed_up_model, warmup_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(num_hidden_layers=2, max_position_embeddings=64)


@pytest.mark.parametrize("points", [3, 5, 7, 15, 255])
def test_router_grid_rounds_each_row_to_its_grid_within_the_bound(points):
    torch.manual_seed(0)
    w = torch.randn(8, 64) * torch.logspace(-3, 0, 8)[:, None]  # rows of very different scales
    q = router_grid(w, points)
    k = (points - 1) // 2
    amax = w.abs().amax(-1, keepdim=True)
    assert ((q - w).abs() <= amax / (2 * k) + 1e-7 * amax).all()
    for row, a in zip(q, amax[:, 0]):
        levels = torch.unique((row / (a / k)).round())
        assert len(levels) <= points and levels.abs().max() <= k
    assert torch.allclose(q.abs().amax(-1, keepdim=True), amax, rtol=1e-6)  # a row's largest weight is a grid point


@pytest.mark.parametrize("bad", [1, 2, 4, 16])
def test_router_grid_refuses_even_or_too_few_points(bad):
    with pytest.raises(ValueError, match="odd and >= 3"):
        router_grid(torch.randn(2, 8), bad)


def test_dial_changes_the_engine_router_only_and_never_the_trainer():
    model = build_model(CFG, 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plain, dial = Engine(model, "fp8-router"), Engine(model, "fp8-router", router_levels=3)
    p, d = dict(plain.model.named_parameters()), dict(dial.model.named_parameters())
    changed = sorted(n for n in p if not torch.equal(p[n], d[n]))
    assert changed and all(n.endswith("mlp.gate.weight") for n in changed)
    src = dict(model.named_parameters())
    for n in changed:
        assert torch.equal(d[n], router_grid(src[n].detach().float(), 3).to(torch.bfloat16))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    b = dial.generate([[1, 2, 3]], max_new_tokens=4, eos_ids=(14,), pad_id=15, group_size=2,
                      generator=torch.Generator().manual_seed(0))
    assert b.meta["router_levels"] == 3 and "router_levels" not in plain.generate(
        [[1, 2, 3]], max_new_tokens=2, eos_ids=(14,), pad_id=15).meta
    with pytest.raises(ValueError, match="dense model has no router"):
        Engine(build_model(CFG.dense_twin(), 0), "bf16", router_levels=3)


def test_fewer_grid_points_flip_more_routes():
    torch.manual_seed(0)
    model = build_model(ModelConfig(num_hidden_layers=2, max_position_embeddings=64, num_experts=16), 0)
    ids = torch.randint(0, 14, (16, 24))
    mask = torch.ones(16, 24, dtype=torch.bool)
    _, own = model(ids)
    rates = []
    for points in (255, 15, 3):
        with torch.no_grad():
            _, routes = Engine(model, "fp32", router_levels=points).model(ids)
        rates.append(flip_stats(own, routes, mask)["router_flip_rate"])
    assert rates[0] < rates[1] < rates[2] and rates[2] > 0.2, rates


@pytest.mark.parametrize("argv, message", [
    (["--router-levels", "4"], "--router-levels must be odd"),
    (["--router-levels", "3", "--dense"], "--dense has no router"),
    (["--router-levels", "3", "--engine", "sglang:http://127.0.0.1:1"], "server engine or --rollouts"),
    (["--router-levels", "3", "--rollouts", "x"], "server engine or --rollouts"),
    (["--warmup-until", "0"], "--warmup-until must be in (0, 1]"),
    (["--warmup-until", "0.3", "--warmup-steps", "0"], "--warmup-until warms a preset up"),
    (["--eval-trainer", "--eval-every", "0"], "--eval-trainer evaluates"),
])
def test_refusals(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse(TrainConfig, argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_warmup_until_stops_at_the_first_probe_that_reaches_its_target(tmp_path):
    task = make_task("sort:3-4")
    cfg = preset_config("toy", task)
    model, path = warmed_up_model(cfg, task, "sort:3-4", steps=60, seed=0, until=0.35, progress=False,
                                  cache_dir=str(tmp_path))
    info = warmup_info(path)
    rewards = [r for _, r in info["probes"]]
    assert info["reached"] and info["until"] == 0.35 and abs(info["probe_reward"] - rewards[-1]) < 1e-4
    assert rewards[-1] >= 0.35 and all(r < 0.35 for r in rewards[:-1])
    assert info["steps"] == info["probes"][-1][0] < 60
    assert abs(probe_reward(model, task) - rewards[-1]) < 1e-4  # the cached weights are the ones probed last
    again, path2 = warmed_up_model(cfg, task, "sort:3-4", steps=60, seed=0, until=0.35, progress=False,
                                   cache_dir=str(tmp_path))
    assert path2 == path and all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    _, fixed = warmed_up_model(cfg, task, "sort:3-4", steps=60, seed=0, progress=False, cache_dir=str(tmp_path))
    assert fixed != path and warmup_info(fixed) == dict(steps=60)


def test_warmup_until_an_unreachable_target_stops_at_the_cap(tmp_path):
    task = make_task("sort:3-4")
    _, path = warmed_up_model(preset_config("toy", task), task, "sort:3-4", steps=7, seed=0, until=1.0,
                              progress=False, cache_dir=str(tmp_path))
    info = warmup_info(path)
    assert info["steps"] == 7 and not info["reached"] and info["probes"][-1][0] == 7


def run(args, cwd):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_train_runs_the_dial_and_logs_the_trainer_greedy_accuracy(tmp_path):
    args = ["--steps", "2", "--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "40",
            "--warmup-until", "0.2", "--task", "sort:3-4", "--no-plot", "--quiet", "--eval-every", "2",
            "--eval-prompts", "6", "--eval-trainer", "--rollout-dtype", "fp8-router", "--router-levels", "3",
            "--out", "run"]
    r = run(args, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    run_json = json.load(open(tmp_path / "run" / "run.json"))
    assert run_json["warmup"]["until"] == 0.2 and run_json["warmup"]["steps"] <= 40
    assert json.load(open(tmp_path / "run" / "args.json"))["router_levels"] == 3
    last = rows[-1]
    assert last["router_flip_rate"] > 0 and 0 <= last["eval/accuracy_greedy_trainer"] <= 1
    # the trainer's greedy accuracy is an fp32 engine's, on the run's held-out prompts, at the final weights
    state = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    task = make_task("sort:3-4")
    model = build_model(preset_config("toy", task), 0)
    model.load_state_dict(state["model"])
    want = evaluate(Engine(model, "fp32"), task, heldout_examples(task, 6), max_new_tokens=task.max_new_tokens,
                    eos_ids=(EOS,), pad_id=PAD, samples=0)["eval/accuracy_greedy"]
    assert last["eval/accuracy_greedy_trainer"] == want


def test_a_run_saved_before_the_new_flags_resumes(tmp_path):
    args = ["--steps", "2", "--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task",
            "sort:3-4", "--no-plot", "--quiet", "--eval-every", "0", "--out", "run"]
    assert run([*args[:1], "1", *args[2:]], tmp_path).returncode == 0
    saved = json.load(open(tmp_path / "run" / "args.json"))
    for k in ("warmup_until", "router_levels", "eval_trainer"):
        saved.pop(k)
    json.dump(saved, open(tmp_path / "run" / "args.json", "w"))
    r = run([*args, "--resume"], tmp_path)
    assert r.returncode == 0 and "resumed" in r.stdout, r.stderr[-2000:]
