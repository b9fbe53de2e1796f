"""What this proves: each mismatch metric equals its DESIGN.md formula on hand-computed cases, counts only valid
response positions, and reports None for the dense twin's flip statistics."""
import math

import torch

from r3.train.metrics import entropy, extreme_frac, flip_stats, kl_full, kl_k3, mismatch


def test_k3_kl_hand_computed():
    lt = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    li = torch.log(torch.tensor([[0.25, 0.2, 0.3]]))
    mask = torch.tensor([[True, True, False]])
    r = [2.0, 1.0]
    want = sum(x - 1 - math.log(x) for x in r) / 2
    assert abs(kl_k3(lt, li, mask) - want) < 1e-9


def test_extreme_frac_uses_max_of_r_and_inverse():
    li = torch.zeros(1, 4)
    lt = torch.log(torch.tensor([[2.5, 0.3, 1.9, 0.6]]))  # r>2, 1/r>2, neither, neither
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert extreme_frac(lt, li, mask, tau=2.0) == 0.5


def test_kl_full_hand_computed():
    pi = torch.tensor([[[0.5, 0.5]], [[0.9, 0.1]]])
    pt = torch.tensor([[[0.25, 0.75]], [[0.9, 0.1]]])
    mask = torch.tensor([[True], [True]])
    want = (0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75) + 0.0) / 2
    assert abs(kl_full(pt.log(), pi.log(), mask) - want) < 1e-7  # inputs are fp32 logs


def test_flip_stats_compare_sets_not_order():
    a = torch.tensor([[[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[0, 2], [1, 3]]]])  # [B=1, T=3, L=2, K=2]
    b = torch.tensor([[[[1, 0], [2, 3]], [[4, 6], [6, 1]], [[0, 2], [1, 3]]]])  # same set, 2 flips, no flip
    mask = torch.tensor([[True, True, True]])
    s = flip_stats(a, b, mask)
    assert s["router_flip_rate"] == 2 / 6
    assert s["token_flip_rate"] == 1 / 3
    assert s["flips_per_token"] == 2 / 3
    s = flip_stats(a, b, torch.tensor([[True, False, True]]))  # the flipped token is masked out
    assert s == dict(router_flip_rate=0.0, token_flip_rate=0.0, flips_per_token=0.0)


def test_masked_positions_do_not_count_and_dense_gives_none():
    lt = torch.tensor([[0.0, -100.0]])
    li = torch.tensor([[0.0, 0.0]])
    out = mismatch(lt, li, torch.tensor([[True, False]]))
    assert out["kl"] == 0.0 and out["extreme_frac"] == 0.0
    assert out["router_flip_rate"] is None and out["token_flip_rate"] is None and out["flips_per_token"] is None


def test_entropy_is_full_distribution_entropy():
    logp = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    assert abs(entropy(logp, torch.tensor([[True]])) - (0.5 * math.log(2) + 0.5 * math.log(4))) < 1e-6
