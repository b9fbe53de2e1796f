"""What this proves: `r3.check` passes clean routes from our engine (fp32 and bf16), and catches a layer shifted by one,
positions shifted by one, zero-padded duplicates (also in a file that load_rollouts refuses) and another model's
routes, each with its finding; the CLI prints the report and exits 1 when something is wrong."""
import dataclasses
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

from r3.rollout.batch import load_rollouts, save_batch
from r3.tools.check import check_alignment, main, render
from r3.rollout.engine import Engine
from r3.model.model import PRESETS, build_model
from r3.model.moe import RoutesError
from r3.runs.checkpoint import save_weights

CFG = PRESETS["toy"]
PROMPTS = [[12, 3, 1, 4, 11], [12, 9, 9, 2, 7, 11], [12, 5, 11], [12, 8, 0, 6, 6, 1, 11]]


def model_of(seed):
    return build_model(CFG, 0).init_weights(seed, std=0.2).float().eval()


@pytest.fixture(scope="module")
def setup():
    model = model_of(0)
    batch = Engine(model, "bf16").generate(PROMPTS, max_new_tokens=10, eos_ids=(14,), pad_id=15, group_size=2,
                                           generator=torch.Generator().manual_seed(0))
    return model, batch


def with_routes(batch, routes):
    b = batch.select(slice(None))
    b.routes = routes
    return b


def names(report):
    return {f["name"] for f in report["findings"] if f["severity"] == "error"}


def test_clean_routes_pass(setup):
    model, batch = setup
    fp32 = Engine(model, "fp32").generate(PROMPTS, max_new_tokens=10, eos_ids=(14,), pad_id=15, group_size=2,
                                          generator=torch.Generator().manual_seed(1))
    for b in (batch, fp32):
        r = check_alignment(model, [b])
        assert r["ok"] and not names(r), render(r)
        assert r["overlap"] > 0.9 and r["kl"]["replay"] <= r["kl"]["no_replay"] + 1e-9  # fp32: both ~0
    assert check_alignment(model, [fp32])["flip_rate"] == 0.0


def test_shifted_layer_is_caught(setup):
    model, batch = setup
    rec = batch.routes.long()
    shifted = torch.cat([rec[:, :, 1:], rec[:, :, -1:]], 2)  # the engine's layer l is the trainer's l + 1
    r = check_alignment(model, [with_routes(batch, shifted)])
    assert not r["ok"] and "layer shift" in names(r) and "position shift" not in names(r), render(r)
    assert "layer i+1" in render(r) and "dense layer" in render(r)


def test_shifted_position_is_caught(setup):
    model, batch = setup
    rec = batch.routes.long()
    shifted = torch.cat([rec[:, 1:], rec[:, -1:]], 1)  # row p holds position p + 1's experts (first row dropped)
    r = check_alignment(model, [with_routes(batch, shifted)])
    assert not r["ok"] and "position shift" in names(r) and "layer shift" not in names(r), render(r)


def test_zero_padding_and_another_model_are_caught(setup):
    model, batch = setup
    zeroed = batch.routes.long().clone()
    fed = (batch.attn_mask[0, :-1] & batch.attn_mask[0, 1:]).nonzero()[:, 0]
    zeroed[0, fed[-3:]] = 0  # the last fed positions of row 0 padded with zeros
    r = check_alignment(model, [with_routes(batch, zeroed)])
    assert "zero padding" in names(r) and r["kl"]["replay"] is None, render(r)
    _, other = model_of(7)(batch.tokens[:, :-1], valid_BT=batch.attn_mask[:, :-1])
    r = check_alignment(model, [with_routes(batch, other)])
    assert "another model" in names(r), render(r)
    empty = batch.routes.long().clone()
    empty[:, :, 2] = 0
    assert {"empty layer", "zero padding"} <= names(check_alignment(model, [with_routes(batch, empty)]))


def test_cli_reads_a_file_load_rollouts_refuses(setup, tmp_path, capsys):
    model, batch = setup
    ckpt = str(tmp_path / "model.safetensors")
    save_weights(model, ckpt, dict(cfg=dataclasses.asdict(CFG)))
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    save_batch(batch, good)
    assert main(["--rollouts", good, "--model", ckpt]) == 0
    assert "verdict: OK" in capsys.readouterr().out
    save_batch(batch, bad, codec="uint8")  # then zero row 0's routes in the file, as a buggy converter would
    fn = os.path.join(bad, "batch.safetensors")
    with safe_open(fn, "pt") as f:
        header = f.metadata()
    t = load_file(fn)
    t["routes"] = t["routes"].view(batch.routes.shape).clone()
    t["routes"][0] = 0
    t["routes"] = t["routes"].reshape(-1)
    save_file(t, fn, metadata=header)
    with pytest.raises(RoutesError):
        load_rollouts(bad, CFG)
    assert main(["--rollouts", bad, "--model", ckpt, "--json", str(tmp_path / "r.json")]) == 1
    out = capsys.readouterr().out
    assert "ERROR zero padding" in out and "likely:" in out and os.path.exists(tmp_path / "r.json")
