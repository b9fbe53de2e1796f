"""What this proves: `score` re-scores a rollout with the trainer, aligned with `rollout_logp`; replay uses exactly
the recorded routes; `old_policy_pass` measures ~0 mismatch on identical numerics, reports the trainer's own flips
under R3, and hands the update the routes its replay mode asks for."""
import pytest
import torch

from r3.train.collect import rollout
from r3.model.model import ModelConfig, build_model
from r3.train.score import old_policy_pass, score
from r3.tasks.tasks import make_task

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)


def make(dtype, dense=False, temperature=1.0):
    model = build_model(CFG.dense_twin() if dense else CFG, 0).init_weights(0, std=0.2)
    batch, _ = rollout(model, make_task("sort:3-6"), num_prompts=6, group_size=4, dtype=dtype, seed=0,
                       temperature=temperature, keep_logp_V=True)
    return model, batch


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fp32_rollout_scores_match_the_engine(temperature):
    model, batch = make("fp32", temperature=temperature)
    with torch.no_grad():
        out = score(model, batch, temperature=temperature)
    m = batch.loss_mask
    assert out.logp.shape == batch.rollout_logp.shape and out.logp_V.shape[-1] == CFG.vocab_size
    assert (out.logp - batch.rollout_logp)[m].abs().max() < 1e-5
    assert (out.logp[~m] == 0).all()
    mm = old_policy_pass(model, batch, replay="r3", temperature=temperature).metrics
    assert mm["kl"] < 1e-8 and mm["kl_full"] < 1e-8 and mm["router_flip_rate"] == 0


def test_replay_uses_the_recorded_routes_and_flips_come_from_the_normal_forward():
    model, batch = make("fp8")
    with torch.no_grad():
        replayed = score(model, batch, replay=True)
        own = score(model, batch, replay=False)
    assert torch.equal(replayed.routes, batch.routes.long())
    normal, r3 = old_policy_pass(model, batch, replay="none"), old_policy_pass(model, batch, replay="r3")
    assert normal.metrics["router_flip_rate"] > 0, "fp8 rollout at std=0.2 should flip some routes"
    for k in ("router_flip_rate", "token_flip_rate", "flips_per_token"):
        assert r3.metrics[k] == normal.metrics[k]
    assert torch.equal(r3.own_routes, own.routes) and torch.equal(normal.own_routes, own.routes)
    assert r3.metrics["kl"] < normal.metrics["kl"]
    assert old_policy_pass(model, batch, replay="r3", own_routes=own.routes).metrics == r3.metrics
    assert torch.equal((r3.logp - replayed.logp)[batch.loss_mask], torch.zeros(int(batch.loss_mask.sum())))


def test_old_policy_pass_hands_each_replay_mode_its_routes():
    model, batch = make("fp8")
    none, r2, r3 = (old_policy_pass(model, batch, replay=m) for m in ("none", "r2", "r3"))
    assert none.routes is None
    assert r3.routes is batch.routes  # R3: the engine's routes, as recorded
    assert torch.equal(r2.routes, none.own_routes)  # R2: the routes of the trainer's own old-policy forward
    assert not torch.equal(r2.routes.sort(-1).values, batch.routes.long().sort(-1).values)
    with pytest.raises(ValueError, match="replay must be one of"):
        old_policy_pass(model, batch, replay="R3")


def test_score_keeps_gradients_for_the_trainer():
    model, batch = make("bf16")
    out = score(model, batch, replay=True)
    (out.logp.sum()).backward()
    assert model.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0


def test_dense_has_no_routes_and_refuses_replay():
    model, batch = make("bf16", dense=True)
    assert batch.routes is None
    m = old_policy_pass(model, batch).metrics
    assert m["router_flip_rate"] is None and m["kl"] >= 0
    with pytest.raises(ValueError, match="no recorded routes"):
        old_policy_pass(model, batch, replay="r3")
    with pytest.raises(ValueError, match="no recorded routes"):
        score(model, batch, replay=True)
