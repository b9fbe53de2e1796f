"""What this proves: the engine's log-probs and routes are those of its own (cast) weights, it stops on EOS with
per-sequence lengths, top-p restricts sampling (not the recorded log-probs), a group prefills its prompt once, a
rollout past the position limit is refused, weight sync refreshes it, and its fused q/k/v and gate/up matmuls give
bit-identical rollouts."""
import copy

import pytest
import torch

from r3.model import moe as moe_mod
from r3.rollout.engine import Engine, sample
from r3.model.quant import fake_quant_e4m3
from r3.model.model import ModelConfig, build_model

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]


def gen(engine, G=2, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    return engine.generate(PROMPTS, max_new_tokens=10, eos_ids=(14,), pad_id=15, group_size=G, generator=g, **kw)


def test_rollout_logp_and_routes_match_a_full_forward_of_the_engine_copy():
    model = build_model(CFG, 0).init_weights(0, std=0.2)
    engine = Engine(model, "fp32")
    b = gen(engine)
    logits, routes = engine.model(b.tokens[:, :-1], valid_BT=b.attn_mask[:, :-1])
    logp = logits.log_softmax(-1).gather(-1, b.tokens[:, 1:, None])[..., 0]
    m = b.loss_mask
    assert (logp - b.rollout_logp)[m].abs().max() < 1e-5
    assert torch.equal(routes[b.attn_mask[:, :-1]], b.routes.long()[b.attn_mask[:, :-1]])


def test_eos_stops_each_sequence_and_pads_after():
    model = build_model(CFG, 1).init_weights(1, std=0.2)
    with torch.no_grad():  # make EOS likely so sequences end at different lengths
        model.lm_head.weight[14] += 0.3 * model.model.norm.weight.sign()
    b = gen(Engine(model, "fp32"), G=4, seed=3)
    lengths = b.response_mask.sum(1)
    assert lengths.min() < lengths.max()
    for i in range(len(b)):
        resp = b.tokens[i][b.response_mask[i]].tolist()
        assert 14 not in resp[:-1]
        after = b.tokens[i, b.response_mask[i].nonzero().max() + 1:]
        assert (after == 15).all()
        assert (b.rollout_logp[i][~b.loss_mask[i]] == 0).all()


def test_group_prefill_is_computed_once_per_prompt():
    b, cache = gen(Engine(build_model(CFG), "bf16"), G=8, return_cache=True)
    Lp = b.meta["prompt_len"]
    assert cache.prefill_tokens == len(PROMPTS) * Lp  # measured by the cache: positions the prefill computed
    assert b.meta["prefill_tokens_computed"] == cache.prefill_tokens
    for p in range(3):  # every sample of a group shares the prompt's recorded routes
        rows = b.routes[b.group == p, :Lp - 1]
        assert (rows == rows[0]).all()


def test_a_rollout_past_the_position_limit_is_refused():
    engine = Engine(build_model(CFG), "bf16")
    with pytest.raises(ValueError, match=r"prompt \(5\) \+ max_new_tokens \(252\) exceeds the model's "
                                         r"max_position_embeddings \(256\)"):
        engine.generate(PROMPTS, max_new_tokens=252, eos_ids=(14,), pad_id=15)
    assert gen(engine).tokens.shape[1] <= 5 + 10  # the same engine still samples within the limit


def test_top_p_records_the_log_probs_of_the_whole_tempered_softmax():
    """The nucleus restricts the draw, not the recorded log-prob: it stays the one the trainer computes."""
    model = build_model(CFG, 0).init_weights(0, std=0.2)
    b = gen(Engine(model, "fp32"), top_p=0.5, temperature=0.7)
    logits, _ = model(b.tokens[:, :-1], valid_BT=b.attn_mask[:, :-1])
    logp_V = (logits / 0.7).log_softmax(-1)
    m = b.loss_mask
    assert (logp_V.gather(-1, b.tokens[:, 1:, None])[..., 0] - b.rollout_logp)[m].abs().max() < 1e-5
    nucleus_mass = logp_V.exp().sort(-1, descending=True).values.cumsum(-1)
    assert (nucleus_mass[..., 0][m] < 0.5).any()  # some draws had a nucleus of several tokens: a real restriction


def test_top_p_keeps_only_the_nucleus():
    logp = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]])).expand(2000, 4)
    s = sample(logp, 0.8, torch.Generator().manual_seed(0))
    assert set(s.tolist()) == {0, 1}


def test_sync_refreshes_engine_weights_and_fp8_is_quantised():
    model = build_model(CFG, 0)
    engine = Engine(model, "fp8")
    w = engine.model.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(w, fake_quant_e4m3(model.model.layers[0].self_attn.q_proj.weight.to(torch.bfloat16)))
    assert torch.equal(engine.model.model.layers[0].mlp.gate.weight,
                       model.model.layers[0].mlp.gate.weight.to(torch.bfloat16))  # router stays bf16
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    engine.sync(model)
    assert torch.equal(engine.model.lm_head.weight, fake_quant_e4m3(model.lm_head.weight.to(torch.bfloat16)))
    assert len(torch.unique(engine.model.lm_head.weight.float() / engine.model.lm_head.weight.float().abs().max()
                            )) <= 256


def _unfused_engine(model, dtype):
    """The engine as it was before its copy fused q/k/v and gate/up: three matmuls for each."""
    engine = Engine(model, dtype)
    engine.model = copy.deepcopy(model).to(engine.dtype).eval().requires_grad_(False)
    engine.sync(model)
    return engine


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp8"])
def test_fused_qkv_and_gate_up_give_bit_identical_rollouts(dtype, monkeypatch):
    monkeypatch.setattr(moe_mod, "ALL_EXPERTS_MAX_MACS", {})  # the grouped path in both (else all experts)
    model = build_model(CFG, 0).init_weights(0, std=0.2)
    fused, plain = Engine(model, dtype), _unfused_engine(model, dtype)
    assert fused.model.model.layers[0].mlp.experts.gate_up_proj is not None
    assert fused.model.model.layers[0].self_attn.qkv_proj is not None
    assert plain.model.model.layers[0].mlp.experts.gate_up_proj is None
    assert list(fused.model.state_dict()) == list(plain.model.state_dict())
    for step in range(2):  # the second time after a weight sync, which must reach the fused tensors
        a, b = gen(fused, seed=step), gen(plain, seed=step)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.rollout_logp, b.rollout_logp)
        assert torch.equal(a.routes, b.routes)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        fused.sync(model)
        plain.sync(model)


def test_fused_tensors_follow_load_state_dict_and_to():
    model = build_model(CFG, 0)
    engine = Engine(model, "fp32")
    ex, attn = engine.model.model.layers[1].mlp.experts, engine.model.model.layers[1].self_attn
    engine.model.load_state_dict({k: v + 1 for k, v in engine.model.state_dict().items()})
    assert torch.equal(ex.gate_up_proj, torch.cat([ex.gate_proj, ex.up_proj], 1))
    engine.model.to(torch.float64)
    assert ex.gate_up_proj.dtype == torch.float64
    assert torch.equal(ex.gate_up_proj, torch.cat([ex.gate_proj, ex.up_proj], 1))
    assert torch.equal(attn.qkv_proj, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    with torch.no_grad():
        ex.up_proj.mul_(2)
        attn.v_proj.weight.mul_(2)
    assert torch.equal(ex.gate_up_proj, torch.cat([ex.gate_proj, ex.up_proj], 1))
    assert torch.equal(attn.qkv_proj, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
