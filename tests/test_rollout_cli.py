"""What this proves: `rollout.py` writes a batch that loads back bit-identical to an in-process generation with the
same seed (checkpoint and preset models), save/load keeps every field, and damaged rollout files fail loudly."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from r3.rollout.batch import Batch, load_batch, save_batch
from r3.model.model import ModelConfig, build_model
from r3.model.moe import RoutesError
from r3.runs.checkpoint import save_weights
from r3.train.collect import rollout
from r3.train.score import score
from r3.tasks.tasks import make_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)
FIELDS = ("tokens", "attn_mask", "response_mask", "rollout_logp", "routes", "rewards", "group")


def run_cli(*args):
    out = subprocess.run([sys.executable, "rollout.py", "--no-progress", "--threads", "1", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def assert_same(a: Batch, b: Batch):
    for k in FIELDS:
        x, y = getattr(a, k), getattr(b, k)
        assert (x is None) == (y is None), k
        if x is not None and k == "routes":  # the default file codec stores each top-k *set* (ids ascending)
            x, y = x.sort(-1).values, y.sort(-1).values
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), k


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")
    save_weights(build_model(CFG, 3).init_weights(3, std=0.2), path, dict(cfg=dataclasses.asdict(CFG)))
    return path


def test_cli_batch_round_trips_bit_identical(tmp_path, checkpoint):
    out = str(tmp_path / "ro")
    stdout = run_cli("--model", checkpoint, "--task", "sort:3-5", "--num-prompts", "3", "--group-size", "2",
                     "--rollout-dtype", "bf16", "--seed", "7", "--out", out)
    assert "reward" in stdout and "router_flip_rate" in stdout
    loaded = load_batch(out)
    model = build_model(CFG, 0)
    model.load_state_dict(load_file(checkpoint))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        again, _ = rollout(model, make_task("sort:3-5"), num_prompts=3, group_size=2, dtype="bf16", seed=7)
    finally:
        torch.set_num_threads(threads)
    assert loaded.routes is not None and loaded.routes.shape[2:] == (2, 2)
    assert_same(loaded, again)
    assert loaded.meta["rollout_dtype"] == "bf16" and loaded.meta["task"] == "sort:3-5"
    assert loaded.meta["exact_frac"] == again.meta["exact_frac"]
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["rows"] == 6 and summary["mismatch"]["n_tokens"] == int(loaded.loss_mask.sum())


def test_cli_dense_preset_has_no_routes(tmp_path):
    out = str(tmp_path / "dense")
    run_cli("--preset", "toy", "--dense", "--warmup-steps", "0", "--num-prompts", "2", "--group-size", "2",
            "--max-new-tokens", "4", "--no-mismatch", "--out", out)
    b = load_batch(out)
    assert b.routes is None and b.tokens.shape[0] == 4 and b.response_mask.sum(1).max() <= 4


def test_save_load_keeps_every_field(tmp_path):
    model = build_model(CFG, 1).init_weights(1, std=0.2)
    batch, _ = rollout(model, make_task("reverse:2-4"), num_prompts=3, group_size=3, dtype="fp8", seed=2)
    save_batch(batch, str(tmp_path))
    loaded = load_batch(str(tmp_path))
    assert_same(loaded, batch)
    assert loaded.meta == json.loads(json.dumps(batch.meta))


@pytest.fixture
def saved(tmp_path):
    model = build_model(CFG, 1).init_weights(1, std=0.2)
    batch, _ = rollout(model, make_task("sort:3-5"), num_prompts=2, group_size=2, dtype="bf16", seed=0)
    save_batch(batch, str(tmp_path))
    return model, str(tmp_path)


def test_truncated_file_is_a_clear_error(saved):
    _, d = saved
    path = os.path.join(d, "batch.safetensors")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_batch(d)


def test_routes_payload_of_the_wrong_length_is_a_clear_error(saved):
    _, d = saved
    path = os.path.join(d, "batch.safetensors")
    with safe_open(path, framework="pt") as f:
        header = f.metadata()
    t = load_file(path)
    t["routes"] = t["routes"][:-1].contiguous()  # one byte short of the encoded routes
    save_file(t, path, metadata=header)
    with pytest.raises((RoutesError, ValueError), match="bytes|length"):
        load_batch(d)


def test_out_of_range_expert_id_is_refused(tmp_path):
    model = build_model(CFG, 1).init_weights(1, std=0.2)
    batch, _ = rollout(model, make_task("sort:3-5"), num_prompts=2, group_size=2, dtype="bf16", seed=0)
    save_batch(batch, str(tmp_path), codec="uint8")  # raw ids on disk, so one can be corrupted in place
    path = os.path.join(str(tmp_path), "batch.safetensors")
    with safe_open(path, framework="pt") as f:
        header = f.metadata()
    t = load_file(path)
    t["routes"][5] = 200
    save_file(t, path, metadata=header)
    with pytest.raises(RoutesError, match="out of range"):
        load_batch(str(tmp_path))
    batch.routes[0, 1, 0, 0] = 200  # and an in-memory batch is refused at replay, never replayed silently
    with pytest.raises(RoutesError, match="out of range"):
        score(model, batch, replay=True)


def test_cli_takes_an_hf_folder_like_train_py(tmp_path):
    """--model means a checkpoint in both scripts: an HF folder works here as in train.py."""
    from r3.scale.hf import save_pretrained
    save_pretrained(build_model(CFG, 5).init_weights(5, std=0.2), str(tmp_path / "hf"))
    stdout = run_cli("--model", str(tmp_path / "hf"), "--task", "sort:3-4", "--prompts-per-step", "2",
                     "--group-size", "2", "--out", str(tmp_path / "ro"))
    assert "HF checkpoint" in stdout and "router_flip_rate" in stdout
    b = load_batch(str(tmp_path / "ro"))
    assert b.routes.shape[2:] == (CFG.num_hidden_layers, CFG.num_experts_per_tok)
