"""What this proves: the model's fast paths equal its slow references (experts, KV-cache decode), padding is
invisible, and training forwards are bit-deterministic on CPU."""
import pytest
import torch

from r3.model.model import KVCache, ModelConfig, build_model
from r3.model.moe import experts_dense_reference

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)


@pytest.mark.parametrize("norm_topk", [True, False])
def test_sorted_dispatch_equals_dense_reference(norm_topk):
    from r3.model.moe import MoE
    torch.manual_seed(0)
    moe = MoE(32, 24, 8, 3, norm_topk)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(50, 32)
    ids, gates = moe.route(x)
    fast = moe.experts(x, ids, gates)
    ref = experts_dense_reference(moe.experts, x, ids, gates)
    assert torch.allclose(fast, ref, atol=1e-5), (fast - ref).abs().max()
    if norm_topk:
        assert torch.allclose(gates.sum(-1), torch.ones(50))


@pytest.mark.parametrize("dense", [False, True])
def test_kv_cache_decode_equals_full_forward_fp32(dense):
    """Tolerance 1e-5 max-abs on logits: only the attention reduction order differs."""
    cfg = CFG.dense_twin() if dense else CFG
    model = build_model(cfg, seed=1).init_weights(1, std=0.2)
    torch.manual_seed(0)
    B, P, N = 3, 5, 7
    ids = torch.randint(0, 16, (B, P + N))
    valid = torch.ones(B, P + N, dtype=torch.bool)
    valid[0, :2] = False  # left padding on row 0
    valid[1, -3:] = False  # right padding on row 1
    full, routes_full = model(ids, valid_BT=valid)
    cache = KVCache(cfg, B, P + N, torch.float32)
    step_logits = [model(ids[:, :P], valid_BT=valid[:, :P], kv_cache=cache)[0]]
    for t in range(P, P + N):
        step_logits.append(model(ids[:, t:t + 1], valid_BT=valid[:, t:t + 1], kv_cache=cache)[0])
    dec = torch.cat(step_logits, 1)
    assert (dec - full)[valid].abs().max() < 1e-5
    if not dense:
        assert torch.equal(cache.routes[:, :P + N].long(), routes_full)


def test_padding_is_invisible():
    model = build_model(CFG, seed=2).init_weights(2, std=0.2)
    ids = torch.randint(0, 16, (1, 6), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([torch.full((1, 3), 15), ids], 1)
    valid = torch.cat([torch.zeros(1, 3, dtype=torch.bool), torch.ones(1, 6, dtype=torch.bool)], 1)
    a, ra = model(ids)
    b, rb = model(padded, valid_BT=valid)
    assert (a - b[:, 3:]).abs().max() < 1e-5
    assert torch.equal(ra, rb[:, 3:])


def test_training_forward_is_bit_deterministic():
    model = build_model(CFG, seed=3)
    ids = torch.randint(0, 16, (4, 12), generator=torch.Generator().manual_seed(2))
    a, ra = model(ids)
    b, rb = model(ids)
    assert torch.equal(a, b) and torch.equal(ra, rb)


def test_dense_twin_matches_active_params_and_has_no_routes():
    moe, dense = build_model(CFG), build_model(CFG.dense_twin())
    active_moe = sum(p.numel() for n, p in moe.named_parameters() if "experts" not in n and "mlp.gate." not in n)
    active_moe += CFG.num_hidden_layers * CFG.num_experts_per_tok * 3 * CFG.hidden_size * CFG.moe_intermediate_size
    assert sum(p.numel() for p in dense.parameters()) == active_moe
    logits, routes = dense(torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(3)))
    assert routes is None and logits.shape == (2, 5, 16)
