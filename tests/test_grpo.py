"""What this proves: group advantages and every loss variant (GRPO clip, Dr. GRPO normalisation, GSPO sequence
ratio, TIS / IcePop / MIS corrections) equal hand-computed values, and the collapse guard fires on planted faults;
per-shard losses over the step's shared denominator add up to the whole-batch loss."""
import math

import pytest
import torch

from r3.train.grpo import correction_weights, group_advantages, loss_denominator, policy_loss
from r3.train.guard import CollapseGuard

OLD = torch.zeros(2, 2)
NEW = torch.log(torch.tensor([[1.5, 0.9], [0.5, 1.1]]))  # ratios
ADV = torch.tensor([1.0, -1.0])
MASK = torch.ones(2, 2, dtype=torch.bool)


def test_group_advantages_hand_computed():
    adv, m = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1]))
    assert torch.allclose(adv, torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2), 0.0, 0.0]), atol=1e-5)
    assert m["reward/zero_std_frac"] == 0.5
    adv, _ = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1]), normalize_std=False)
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_grpo_clipped_token_mean():
    # token losses: -min(1.5,1.28)=-1.28, -0.9, -min(-0.5,-0.8)=0.8, -min(-1.1,-1.1)=1.1
    loss, m = policy_loss(NEW, OLD, ADV, MASK, loss="grpo", clip_low=0.2, clip_high=0.28)
    assert abs(float(loss) - (-1.28 - 0.9 + 0.8 + 1.1) / 4) < 1e-6
    assert m["grpo/clip_frac"] == 0.5


def test_masked_tokens_do_not_count():
    mask = torch.tensor([[True, False], [True, False]])
    loss, _ = policy_loss(NEW, OLD, ADV, mask, loss="grpo", clip_low=0.2, clip_high=0.28)
    assert abs(float(loss) - (-1.28 + 0.8) / 2) < 1e-6


def test_dr_grpo_divides_by_constant():
    loss, _ = policy_loss(NEW, OLD, ADV, MASK, loss="dr_grpo", clip_low=0.2, clip_high=0.28, max_len=4)
    assert abs(float(loss) - (-1.28 - 0.9 + 0.8 + 1.1) / (2 * 4)) < 1e-6


@pytest.mark.parametrize("loss, denominator", [("grpo", 4), ("dr_grpo", 2 * 4)])
def test_clipped_token_loss_gradient_by_hand(loss, denominator):
    """d loss / d logp_t = -A ρ_t / n where min() took the unclipped term, 0 where it took the clipped one."""
    new = NEW.clone().requires_grad_(True)
    value, _ = policy_loss(new, OLD, ADV, MASK, loss=loss, clip_low=0.2, clip_high=0.28, max_len=4)
    value.backward()
    # ratios [[1.5, 0.9], [0.5, 1.1]], A [1, -1]: 1.5 is clipped at 1.28 (A > 0), 0.5 at 0.8 (A < 0)
    want = torch.tensor([[0.0, -0.9], [0.0, 1.1]]) / denominator
    assert torch.allclose(new.grad, want, atol=1e-7)


def test_gspo_sequence_ratio_and_clip():
    loss, m = policy_loss(NEW, OLD, ADV, MASK, loss="gspo", clip_low=0.2, clip_high=0.28)
    s0, s1 = math.sqrt(1.5 * 0.9), math.sqrt(0.5 * 1.1)
    want = (-min(s0, 1.28) + -min(-s1, -0.8)) / 2
    assert abs(float(loss) - want) < 1e-6
    assert m["grpo/clip_frac"] == 0.5  # row 1 is clipped (0.74 < 0.8), row 0 is not


def test_gspo_gradient_equals_sequence_level_objective():
    new = NEW.clone().requires_grad_(True)
    loss, _ = policy_loss(new, OLD, ADV, MASK, loss="gspo", clip_low=0.5, clip_high=0.5)
    loss.backward()
    ref = NEW.clone().requires_grad_(True)
    s = ref.mean(-1).exp()
    (-(s * ADV).mean()).backward()
    assert torch.allclose(new.grad, ref.grad, atol=1e-6)


def test_tis_truncates_weights():
    roll = torch.log(torch.tensor([[1 / 3, 2.0], [1.0, 1.0]]))  # w = old/rollout = [3, 0.5, 1, 1]
    w, mask, m = correction_weights(OLD, roll, MASK, kind="tis", cap=2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5], [1.0, 1.0]]))
    assert mask.all() and m["is/truncated_frac"] == 0.25
    loss, _ = policy_loss(NEW, OLD, ADV, MASK, loss="grpo", clip_low=0.2, clip_high=0.28, rollout_logp_BT=roll,
                          is_correction="tis", is_cap=2.0)
    assert abs(float(loss) - (-1.28 * 2 - 0.9 * 0.5 + 0.8 + 1.1) / 4) < 1e-6


def test_icepop_masks_tokens_outside_band():
    roll = torch.log(torch.tensor([[1 / 3, 2.0], [1.0, 1 / 0.4]]))  # w = [3, 0.5, 1, 0.4]
    w, mask, m = correction_weights(OLD, roll, MASK, kind="icepop", cap=2.0)
    assert mask.tolist() == [[False, True], [True, False]]
    assert torch.allclose(w[mask], torch.tensor([0.5, 1.0]))  # inside the band: the untruncated ratio
    assert m["is/masked_frac"] == 0.5
    loss, _ = policy_loss(NEW, OLD, ADV, MASK, loss="grpo", clip_low=0.2, clip_high=0.28, rollout_logp_BT=roll,
                          is_correction="icepop", is_cap=2.0)
    assert abs(float(loss) - (-0.9 * 0.5 + 0.8 * 1.0) / 2) < 1e-6  # the kept tokens only, each weighted


def test_mis_masks_whole_sequences():
    roll = torch.log(torch.tensor([[1 / 3, 1 / 3], [1.0, 1 / 1.5]]))  # geo-mean w: 3 (drop), sqrt(1.5) (keep)
    w, mask, m = correction_weights(OLD, roll, MASK, kind="mis", cap=2.0)
    assert mask.tolist() == [[False, False], [True, True]]
    assert torch.allclose(w[1], torch.full((2,), math.sqrt(1.5)))
    assert m["is/masked_frac"] == 0.5


def test_unknown_loss_is_refused():
    with pytest.raises(ValueError, match="unknown loss"):
        policy_loss(NEW, OLD, ADV, MASK, loss="ppo2")


def healthy(step, reward=0.8, **kw):
    return dict(step=step, reward=reward, loss=0.1, grad_norm=1.0, kl=1e-4, extreme_frac=0.0,
                response_length=10.0, runaway_frac=0.0) | kw


def test_guard_fires_on_planted_nan():
    g = CollapseGuard()
    assert g.check(healthy(0)) == []
    assert "nonfinite" in g.check(healthy(1, loss=float("nan")))
    assert g.new == ["nonfinite"]


def test_guard_fires_on_planted_reward_drop_and_not_before():
    g = CollapseGuard(reward_drop=0.3, ema=0.5, warmup=3)
    fired = [g.check(healthy(i, reward=0.8)) for i in range(10)]
    assert all(f == [] for f in fired)
    fired = [g.check(healthy(10 + i, reward=0.1)) for i in range(5)]
    assert "reward_drop" in fired[-1]
    assert g.new == [] and "reward_drop" in g.active  # onset was reported once, earlier


@pytest.mark.parametrize("loss, is_correction", [("grpo", "none"), ("grpo", "icepop"), ("dr_grpo", "tis"),
                                                 ("gspo", "mis")])
def test_shard_losses_with_the_step_denominator_sum_to_the_whole_batch_loss(loss, is_correction):
    """What train.py's data shards rely on: per-shard losses over a shared denominator add up to the full loss."""
    g = torch.Generator().manual_seed(0)
    B, T = 6, 7
    logp = (-torch.rand(B, T, generator=g)).requires_grad_()
    old, roll = -torch.rand(B, T, generator=g), -torch.rand(B, T, generator=g)
    adv, mask = torch.randn(B, generator=g), torch.rand(B, T, generator=g) > 0.3
    kw = dict(loss=loss, is_correction=is_correction, is_cap=1.5, max_len=T)
    full, _ = policy_loss(logp, old, adv, mask, rollout_logp_BT=roll, **kw)
    halves = [slice(0, 2), slice(2, 6)]
    den = sum(loss_denominator(old[h], roll[h], mask[h], **kw) for h in halves)
    parts = sum(policy_loss(logp[h], old[h], adv[h], mask[h], rollout_logp_BT=roll[h], denominator=den, **kw)[0]
                for h in halves)
    assert torch.allclose(parts, full, atol=1e-6), (parts, full)
    g_full, = torch.autograd.grad(full, logp)
    g_parts, = torch.autograd.grad(parts, logp)
    assert torch.allclose(g_full, g_parts, atol=1e-6)


def test_clip_frac_counts_only_tokens_where_clipping_is_active():
    # ratio 1.5 with A>0 is clipped (active); ratio 1.5 with A<0 is out of band but min() keeps the unclipped term
    new = torch.log(torch.tensor([[1.5], [1.5], [1.0]]))
    _, m = policy_loss(new, torch.zeros(3, 1), torch.tensor([1.0, -1.0, 1.0]), torch.ones(3, 1, dtype=torch.bool),
                       loss="grpo", clip_low=0.2, clip_high=0.28)
    assert abs(m["grpo/clip_frac"] - 1 / 3) < 1e-6
