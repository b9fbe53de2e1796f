"""What this proves: weights are refused where they are read, naming the tensor, when they hold a NaN / inf (an HF
shard, a save_weights file, a training checkpoint's model, engine or optimizer state) or would be cast silently (an
int32 or fp8 tensor where a float weight belongs); a refused checkpoint restores nothing; an empty ckpt.pt says so."""
import dataclasses

import pytest
import torch
from safetensors.torch import load_file, save_file

from r3.runs.checkpoint import CheckpointFileError, load_checkpoint, load_weights, save_checkpoint, save_weights
from r3.rollout.engine import Engine
from r3.scale.hf import CheckpointError, load_pretrained, save_pretrained
from r3.model.model import ModelConfig, build_model

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)
EXPERT = "model.layers.1.mlp.experts.3.down_proj.weight"


def hf_folder(tmp_path, edit):
    path = tmp_path / "hf"
    save_pretrained(build_model(CFG, 0), str(path))
    shard = str(path / "model.safetensors")
    sd = load_file(shard)
    edit(sd)
    save_file(sd, shard, metadata={"format": "pt"})
    return str(path)


@pytest.mark.parametrize("edit, words", [
    (lambda sd: sd[EXPERT].view(-1).__setitem__(5, float("nan")), rf"tensor '{EXPERT}' holds 1 non-finite value"),
    (lambda sd: sd["lm_head.weight"].__setitem__((2, 3), float("inf")),
     r"tensor 'lm_head.weight' holds 1 non-finite value\(s\) \(first at index \[2, 3\]: inf\)"),
    (lambda sd: sd.update({EXPERT: sd[EXPERT].to(torch.int32)}), rf"'{EXPERT}' is torch.int32, where a float weight "
                                                                 r"belongs \(would be cast to a float silently\)"),
    (lambda sd: sd.update({EXPERT: sd[EXPERT].to(torch.float8_e4m3fn)}), "needs the scales of a quantised checkpoint"),
])
def test_hf_shards_with_non_finite_or_non_float_weights_are_refused_by_name(tmp_path, edit, words):
    path = hf_folder(tmp_path, edit)
    with pytest.raises(CheckpointError, match=words):
        load_pretrained(path)


def test_hf_loader_still_takes_float_dtypes(tmp_path):
    path = hf_folder(tmp_path, lambda sd: sd.update({k: v.to(torch.float16) for k, v in sd.items()}))
    assert load_pretrained(path, dtype=torch.float32).lm_head.weight.dtype == torch.float32


def test_save_weights_files_with_a_nan_or_an_int_tensor_are_refused_by_name(tmp_path):
    path = str(tmp_path / "w.safetensors")
    save_weights(build_model(CFG, 0), path, dict(cfg=dataclasses.asdict(CFG)))
    sd = load_file(path)
    sd["model.norm.weight"][1] = float("nan")
    save_file(sd, path)
    with pytest.raises(CheckpointFileError, match="'model.norm.weight' holds 1 non-finite"):
        load_weights(build_model(CFG, 1), path)
    sd["model.norm.weight"] = torch.ones(32, dtype=torch.int32)
    save_file(sd, path)
    with pytest.raises(CheckpointFileError, match="'model.norm.weight' is torch.int32"):
        load_weights(build_model(CFG, 1), path)


def _state(seed):
    model = build_model(CFG, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long))[0].sum().backward()
    opt.step()
    return model, opt, Engine(model, "bf16"), dict(data=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("damage, words", [
    (lambda s: s["model"]["lm_head.weight"].__setitem__((0, 0), float("nan")), "'model.lm_head.weight' holds 1 "),
    (lambda s: s["engine"]["model.norm.weight"].__setitem__(0, float("inf")), "'engine.model.norm.weight' holds 1"),
    (lambda s: s["optimizer"]["state"][0]["exp_avg_sq"].__setitem__((0, 0), float("nan")),
     "optimizer state 'exp_avg_sq' of parameter 0 holds NaN/inf"),
    (lambda s: s["model"].update({"model.norm.weight": torch.ones(32, dtype=torch.long)}), "is torch.int64"),
])
def test_a_checkpoint_with_damaged_weights_restores_nothing(tmp_path, damage, words):
    path = str(tmp_path / "ckpt.pt")
    model, opt, engine, gens = _state(0)
    save_checkpoint(path, model=model, optimizer=opt, engine=engine, generators=gens, step=3, extra=dict(guard={}))
    state = torch.load(path, weights_only=True)
    damage(state)
    torch.save(state, path)
    m2, o2, e2, g2 = _state(1)
    before = {k: v.clone() for k, v in m2.state_dict().items()}
    with pytest.raises(CheckpointFileError, match=words):
        load_checkpoint(path, model=m2, optimizer=o2, engine=e2, generators=g2)
    assert all(torch.equal(v, before[k]) for k, v in m2.state_dict().items())


def test_an_empty_checkpoint_says_it_is_empty(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"")
    model, opt, engine, gens = _state(0)
    with pytest.raises(CheckpointFileError, match=r"ckpt.pt' is empty \(0 bytes\)"):
        load_checkpoint(str(path), model=model, optimizer=opt, engine=engine, generators=gens)
    path.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(CheckpointFileError, match=r"cannot read checkpoint .*ckpt.pt': \w+Error: \S"):
        load_checkpoint(str(path), model=model, optimizer=opt, engine=engine, generators=gens)
