"""What this proves (issue 23): when the collapse guard stops a run (--on-collapse stop), ckpt.pt holds the state the
onset step started from, not the collapsed one (the onset step's finite mini-steps were applied): a --resume from it
recomputes the onset step bit for bit, and the collapsed state is saved beside it as collapse_stepN.pt, never over
ckpt.pt. Only --on-collapse stop in one process holds the copy of the step's starting state, refreshed in place."""
import json
import sys
import types

import torch

import train
from r3.errors import run_main

TINY = ["--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task", "sort:3-4", "--val-every",
        "0", "--eval-every", "0", "--dump-every", "0", "--no-plot", "--quiet", "--save-every", "100", "--out", "run"]
BLOW_UP = ["--resume", "--lr", "1e6", "--allow-change", "lr,on_collapse"]  # the command on a healthy run


def run(monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, *args])
    run_main(train.main)


def metrics():
    return [json.loads(x) for x in open("run/metrics.jsonl")]


def max_abs(state):
    return max(float(v.abs().max()) for v in state["model"].values())


def test_a_guard_stop_keeps_the_pre_onset_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run(monkeypatch, "--steps", "2")
    healthy = torch.load("run/ckpt.pt", weights_only=True)
    run(monkeypatch, *BLOW_UP, "--steps", "6", "--on-collapse", "stop")
    stopped = metrics()
    onset = next(m["step"] for m in stopped if m["symptoms"])
    assert json.load(open("run/done.json"))["stopped_on"] == stopped[onset]["symptoms"] and len(stopped) == onset + 1
    ckpt = torch.load("run/ckpt.pt", weights_only=True)
    collapsed = torch.load(f"run/collapse_step{onset}.pt", weights_only=True)
    assert ckpt["step"] == onset and collapsed["step"] == onset + 1
    assert max_abs(ckpt) < 10 < 1000 < max_abs(collapsed)  # blown-up weights beside, healthy ones in ckpt.pt
    if onset == 2:  # the first resumed step: its starting state is the healthy checkpoint itself
        assert all(torch.equal(v, healthy["model"][k]) for k, v in ckpt["model"].items())
    run(monkeypatch, *BLOW_UP, "--steps", str(onset + 1), "--on-collapse", "continue")
    again = metrics()
    assert len(again) == onset + 1
    drop = lambda m: {k: v for k, v in m.items() if k != "step_time"}  # noqa: E731
    assert json.dumps(drop(again[onset])) == json.dumps(drop(stopped[onset]))  # bit for bit (NaN as NaN)


def test_only_a_stopping_single_process_run_copies_the_step_start():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    base = dict(model=model, opt=opt, gens=dict(data=torch.Generator()), guard=train.CollapseGuard(), world=1,
                step_start=None, lag=None)
    stop = types.SimpleNamespace(cfg=types.SimpleNamespace(on_collapse="stop"), **base)
    s = train.step_start_state(stop)
    assert torch.equal(s["model"]["weight"], model.weight)
    assert s["model"]["weight"].data_ptr() != model.weight.data_ptr()
    exp_avg = opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(s["opt"]["state"][0]["exp_avg"], exp_avg)
    assert s["opt"]["state"][0]["exp_avg"].data_ptr() != exp_avg.data_ptr()  # a copy, not the live tensor
    stop.step_start = s
    with torch.no_grad():
        model.weight.add_(1.0)
    s2 = train.step_start_state(stop)  # the next step's start, copied into the same buffers
    assert torch.equal(s2["model"]["weight"], model.weight) and s2["model"]["weight"].data_ptr() == \
        s["model"]["weight"].data_ptr()
    assert train.step_start_state(types.SimpleNamespace(cfg=types.SimpleNamespace(on_collapse="continue"),
                                                        **base)) is None
    assert train.step_start_state(types.SimpleNamespace(**{**vars(stop), "world": 2})) is None
