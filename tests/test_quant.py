"""What this proves: every low-bit rollout format round-trips weights within its format's error bound
(r3/model/quant.py), touches exactly the weights it should (the router only for fp8-router), and the engine samples with
each."""
import pytest
import torch

from r3.rollout.engine import ROLLOUT_DTYPES, Engine
from r3.model.model import ModelConfig, build_model
from r3.model.quant import FORMATS, quantise

CFG = ModelConfig(num_hidden_layers=2, max_position_embeddings=64)


def _amax_blocks(w, size):
    g = min(size, w.shape[-1])
    return w.abs().reshape(*w.shape[:-1], -1, g).amax(-1, keepdim=True).expand(*w.shape[:-1], -1, g).reshape(w.shape)


# (format, per-element bound as a function of the weight): the bounds stated in r3/model/quant.py's docstring
BOUNDS = {
    "fp8": lambda w: w.abs() * 2 ** -4 + w.abs().amax(dim=(-2, -1), keepdim=True) / 448 * 2 ** -10,
    "fp8-channel": lambda w: w.abs() * 2 ** -4 + w.abs().amax(-1, keepdim=True) / 448 * 2 ** -10,
    "fp8-router": lambda w: w.abs() * 2 ** -4 + w.abs().amax(dim=(-2, -1), keepdim=True) / 448 * 2 ** -10,
    "int4": lambda w: _amax_blocks(w, 128) / 14,
    "fp4": lambda w: _amax_blocks(w, 16) / 6 * 1.07,  # + the e4m3 rounding of the group scale
    "mxfp4": lambda w: _amax_blocks(w, 32) / 2,
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_round_trip_within_bound(fmt):
    torch.manual_seed(0)
    w = torch.randn(3, 48, 256) * torch.logspace(-3, 0, 48)[:, None]  # rows of very different scales
    q = quantise(fmt, "experts.gate_proj", w)
    assert q.shape == w.shape and q.dtype == w.dtype and not torch.equal(q, w)
    assert ((q - w).abs() <= BOUNDS[fmt](w) + 1e-12).all()
    rel = float((q - w).norm() / w.norm())
    assert 0 < rel < {"int4": 0.15, "fp4": 0.2, "mxfp4": 0.3}.get(fmt, 0.05)
    assert torch.equal(quantise(fmt, "model.norm.weight", w), w)  # norms are never quantised
    router = quantise(fmt, "model.layers.0.mlp.gate.weight", w[0])
    assert torch.equal(router, w[0]) == (fmt != "fp8-router")


def test_int4_has_at_most_16_levels_per_group():
    w = torch.randn(4, 256)
    q = quantise("int4", "q_proj.weight", w).reshape(4, 2, 128)
    assert all(len(torch.unique(q[i, j])) <= 16 for i in range(4) for j in range(2))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_engine_samples_with_each_format(fmt):
    assert fmt in ROLLOUT_DTYPES
    model = build_model(CFG, 0)
    engine = Engine(model, fmt)
    b = engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=6, eos_ids=(14,), pad_id=15, group_size=2,
                        generator=torch.Generator().manual_seed(0))
    assert b.tokens.shape[0] == 4 and torch.isfinite(b.rollout_logp).all() and b.routes is not None
    q = engine.model.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(q, quantise(fmt, "q_proj.weight", model.model.layers[0].self_attn.q_proj.weight.bfloat16()))
