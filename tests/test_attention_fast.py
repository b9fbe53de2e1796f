"""What this proves: attention builds a mask only where padding or a cache needs one (none for an unpadded
uncached forward, a key-padding row for one decoded position), the mask-free causal path equals the masked one,
KV-cache decode with query heads folded onto their KV head equals a full forward for MHA and wide GQA, and the
low-precision decode attention rounds as SDPA's fused kernel does (its unnormalised probabilities in q's dtype)."""
import pytest
import torch
import torch.nn.functional as F

from r3.model.model import KVCache, ModelConfig, attention_mask, build_model, decode_attention

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)


def test_mask_only_where_needed():
    B, T = 3, 5
    valid = torch.ones(B, T, dtype=torch.bool)
    assert attention_mask(None, None, B, T, "cpu") is None
    assert attention_mask(valid, None, B, T, "cpu").shape == (B, 1, T, T)
    cache = KVCache(CFG, B, 16, torch.float32)
    cache.commit(valid, torch.zeros(B, T, 2, 2, dtype=torch.long))
    cache.valid[0, 1] = False
    decode = attention_mask(valid[:, :1], cache, B, 1, "cpu")
    assert decode.shape == (B, 1, 1, T + 1)
    assert decode[0, 0, 0].tolist() == [True, False, True, True, True, True]  # padded key hidden, self visible
    assert attention_mask(valid[:, :2], cache, B, 2, "cpu").shape == (B, 1, 2, T + 2)


def test_causal_without_mask_equals_masked_forward():
    model = build_model(CFG, seed=0).init_weights(0, std=0.2)
    ids = torch.randint(0, 16, (2, 9), generator=torch.Generator().manual_seed(1))
    a, ra = model(ids)
    b, rb = model(ids, valid_BT=torch.ones(2, 9, dtype=torch.bool))
    assert (a - b).abs().max() < 1e-6 and torch.equal(ra, rb)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 1), (8, 2)])
def test_folded_decode_equals_full_forward(heads, kv_heads):
    cfg = ModelConfig(**{**CFG.__dict__, "num_attention_heads": heads, "num_key_value_heads": kv_heads})
    model = build_model(cfg, seed=1).init_weights(1, std=0.2)
    ids = torch.randint(0, 16, (3, 10), generator=torch.Generator().manual_seed(0))
    valid = torch.ones(3, 10, dtype=torch.bool)
    valid[0, :3] = False
    valid[2, -2:] = False
    full, routes = model(ids, valid_BT=valid)
    cache = KVCache(cfg, 3, 10, torch.float32)
    steps = [model(ids[:, :4], valid_BT=valid[:, :4], kv_cache=cache)[0]]
    steps += [model(ids[:, t:t + 1], valid_BT=valid[:, t:t + 1], kv_cache=cache)[0] for t in range(4, 10)]
    assert (torch.cat(steps, 1) - full)[valid].abs().max() < 1e-5
    assert torch.equal(cache.routes[:, :10].long()[valid], routes[valid])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("S", [5, 67, 300])
def test_decode_attention_matches_sdpa(dtype, S):
    """Within one rounding of the output; and closer to SDPA than the same sum with unrounded probabilities."""
    g = torch.Generator().manual_seed(S)
    q, k, v = (torch.randn(16, 2, n, 8, generator=g).to(dtype) for n in (2, S, S))
    mask = torch.rand(16, 1, 1, S, generator=g) > 0.2
    mask[..., -1] = True  # the new position sees itself
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = decode_attention(q, k.float(), v.float(), mask)
    assert out.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out, ref, atol=2 * eps, rtol=2 * eps)
    if dtype != torch.float32:
        p = (q.float() @ k.float().mT / 8 ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        unrounded = (p @ v.float()).to(dtype)
        assert (out == ref).float().mean() > (unrounded == ref).float().mean()
