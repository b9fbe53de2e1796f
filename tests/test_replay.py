"""What this proves: R3 replay uses exactly the recorded experts, keeps the router's gradient (even for experts the
trainer would not pick), is a no-op on identical numerics, and refuses malformed routes with a clear error."""
import pytest
import torch

from r3.rollout.engine import Engine
from r3.model.model import ModelConfig, build_model
from r3.model.moe import MoE, RoutesError, experts_dense_reference

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)


def rollout(dtype="bf16", seed=0, B=4, G=2):
    model = build_model(CFG, seed).init_weights(seed, std=0.2)
    engine = Engine(model, dtype)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 14, (n,), generator=g).tolist() for n in (4, 6, 5, 3)[:B]]
    batch = engine.generate(prompts, max_new_tokens=8, eos_ids=(14,), pad_id=15, group_size=G, generator=g)
    return model, batch


def test_replayed_forward_uses_exactly_the_recorded_routes():
    model, batch = rollout("bf16")
    _, used = model(batch.tokens[:, :-1], valid_BT=batch.attn_mask[:, :-1], routes_BTLK=batch.routes)
    assert torch.equal(used, batch.routes.long())
    _, own = model(batch.tokens[:, :-1], valid_BT=batch.attn_mask[:, :-1])
    assert not torch.equal(own, batch.routes.long()), "bf16 rollout should flip at least one route at std=0.2"


def _reference_moe_forward(moe, x_BTD, replay_ids_BTK=None):
    """MoE.forward written out by hand: the replayed ids (never the router's top-k), gates from the live router's
    full softmax, renormalised over the replayed set, every expert computed densely and weighted."""
    B, T, D = x_BTD.shape
    x_ND = x_BTD.reshape(B * T, D)
    ids_NK = replay_ids_BTK.reshape(B * T, -1).long()
    gates_NK = torch.softmax(x_ND.float() @ moe.gate.weight.float().T, -1).gather(-1, ids_NK)
    if moe.norm_topk_prob:
        gates_NK = gates_NK / gates_NK.sum(-1, keepdim=True)
    y_ND = experts_dense_reference(moe.experts, x_ND, ids_NK, gates_NK.to(x_ND.dtype))
    return y_ND.view(B, T, D), ids_NK.view(B, T, -1)


def test_replayed_forward_computes_with_the_recorded_experts(monkeypatch):
    """Not only the ids it returns: the output is that of the recorded experts, weighted by the live router."""
    model, batch = rollout("bf16")
    x, v = batch.tokens[:, :-1], batch.attn_mask[:, :-1]
    replay, _ = model(x, valid_BT=v, routes_BTLK=batch.routes)
    own, _ = model(x, valid_BT=v)
    monkeypatch.setattr(MoE, "forward", _reference_moe_forward)
    reference, _ = model(x, valid_BT=v, routes_BTLK=batch.routes)
    assert (replay - reference)[v].abs().max() < 1e-5
    assert (own - reference)[v].abs().max() > 1e-2  # the flipped routes matter, so the check above has teeth


def test_replay_equals_normal_routing_on_same_numerics():
    model, batch = rollout("fp32")
    x, v = batch.tokens[:, :-1], batch.attn_mask[:, :-1]
    normal, own = model(x, valid_BT=v)
    replay, _ = model(x, valid_BT=v, routes_BTLK=batch.routes)
    assert torch.equal(own, batch.routes.long())  # fp32 KV decode picks the same experts as the full forward
    assert torch.equal(normal, replay)  # the same ids in the same order: gather returns topk's very floats


@pytest.mark.parametrize("norm_topk", [True, False])
def test_router_gets_gradient_for_replayed_expert_training_would_not_pick(norm_topk):
    torch.manual_seed(0)
    moe = MoE(16, 8, 6, 2, norm_topk_prob=norm_topk)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(1, 1, 16)
    own_ids = moe.route(x[0])[0][0]
    replay = torch.tensor([e for e in range(6) if e not in own_ids.tolist()][:2]).view(1, 1, 2)
    y, used = moe(x, replay)
    assert torch.equal(used, replay)
    y.pow(2).sum().backward()
    g = moe.gate.weight.grad.abs().sum(-1)
    replayed = g[replay.flatten()]
    assert (replayed > 0).all(), f"replayed experts got no router gradient: {replayed}"
    others = g[[e for e in range(6) if e not in replay.flatten().tolist()]]
    if norm_topk:  # g_i = exp(s_i) / Σ_{j∈I} exp(s_j): the full-softmax normaliser cancels, so only I gets gradient
        assert others.max() < 1e-5 * replayed.min()
    else:  # g_i = softmax(s)_i: the normaliser couples every logit, so every row gets gradient
        assert others.min() > 1e-3 * replayed.min()


def test_replay_gates_are_renormalised_live_softmax():
    torch.manual_seed(1)
    moe = MoE(8, 4, 5, 2, norm_topk_prob=True)
    x = torch.randn(3, 8)
    ids = torch.tensor([[0, 4], [1, 2], [3, 0]])
    got_ids, gates = moe.route(x, ids)
    p = torch.softmax(x @ moe.gate.weight.T, -1).gather(-1, ids)
    assert torch.equal(got_ids, ids)
    assert torch.allclose(gates, p / p.sum(-1, keepdim=True), atol=1e-6)


BAD = {
    "wrong dtype": (lambda r: r.float(), "integer tensor"),
    "bool": (lambda r: r.bool(), "integer tensor"),
    "wrong layer count": (lambda r: r[:, :, :2], "layers"),
    "wrong k": (lambda r: r[..., :1], " k "),
    "wrong length": (lambda r: r[:, :-1], "positions"),
    "wrong batch": (lambda r: r[:-1], "batch"),
    "not 4-d": (lambda r: r[0], "shape"),
    "out of range": (lambda r: r.long().index_fill(0, torch.tensor([1]), 8), "out of range"),
    "duplicates": (lambda r: r.long().index_fill(3, torch.tensor([1]), 3).index_fill(3, torch.tensor([0]), 3),
                   "duplicate"),
    "missing": (lambda r: r.long().index_fill(1, torch.tensor([2]), -1), "missing"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_routes_are_refused_with_a_clear_error(case):
    model, batch = rollout("bf16")
    corrupt, words = BAD[case]
    with pytest.raises(RoutesError, match=words):
        model(batch.tokens[:, :-1], valid_BT=batch.attn_mask[:, :-1], routes_BTLK=corrupt(batch.routes))


def test_dense_twin_refuses_routes():
    model, batch = rollout("bf16")
    dense = build_model(CFG.dense_twin())
    with pytest.raises(RoutesError, match="dense"):
        dense(batch.tokens[:, :-1], routes_BTLK=batch.routes)
