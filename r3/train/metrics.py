"""Train/inference mismatch metrics, with the formulas the README's "Metrics" table gives.

All per-token quantities are indexed by input position p (scoring token p+1) and averaged over `mask`, the valid
response positions (`Batch.loss_mask`): never the prompt, never padding.
  r = π_train(y) / π_infer(y) for the sampled token y
  kl            mean(r − 1 − log r)                               (k3 estimator; the paper's and verl's)
  kl_full       mean_p Σ_v p_infer(v) (log p_infer(v) − log p_train(v))
  extreme_frac  mean 1[max(r, 1/r) > τ], τ = 2                    (the paper's F(τ))
  router_flip_rate   fraction of (token, layer) whose top-k *set* differs
  token_flip_rate    fraction of tokens with ≥ 1 flipped layer
  flips_per_token    mean number of flipped layers per token
"""
import math

import torch

# what `r3.train.score.old_policy_pass` measures; None in a metrics row of a step that did not measure
# (--mismatch-every)
MISMATCH_KEYS = ("kl", "extreme_frac", "kl_full", "router_flip_rate", "token_flip_rate", "flips_per_token",
                 "entropy")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of x over the True positions of mask (NaN when there are none)."""
    n = mask.sum()
    if n == 0:
        return float("nan")
    return float((x * mask).sum() / n)


def kl_k3(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor) -> float:
    log_r = (logp_train - logp_infer).double()
    return masked_mean(log_r.exp() - 1 - log_r, mask)


def kl_full(logp_train_V: torch.Tensor, logp_infer_V: torch.Tensor, mask: torch.Tensor) -> float:
    """KL(π_infer ‖ π_train) over the whole vocabulary; inputs are log-probs [..., V]."""
    li, lt = logp_infer_V.double(), logp_train_V.double()
    return masked_mean((li.exp() * (li - lt)).sum(-1), mask)


def extreme_frac(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor, tau: float = 2.0) -> float:
    return masked_mean(((logp_train - logp_infer).abs() > math.log(tau)).double(), mask)


def entropy(logp_V: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean Shannon entropy of the full next-token distribution (not the sampled token's −log p)."""
    return masked_mean(-(logp_V.exp() * logp_V).sum(-1), mask)


def flip_stats(routes_a: torch.Tensor | None, routes_b: torch.Tensor | None, mask: torch.Tensor) -> dict:
    """Compare two [B, T, L, K] route tensors as *sets* per (token, layer). None-valued when dense."""
    if routes_a is None or routes_b is None:
        return dict(router_flip_rate=None, token_flip_rate=None, flips_per_token=None)
    a = routes_a.long().sort(-1).values
    b = routes_b.long().sort(-1).values
    flipped_BTL = (a != b).any(-1).double()
    flips_BT = flipped_BTL.sum(-1)
    return dict(router_flip_rate=masked_mean(flipped_BTL.mean(-1), mask),
                token_flip_rate=masked_mean((flips_BT > 0).double(), mask),
                flips_per_token=masked_mean(flips_BT, mask))


def mismatch(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor,
             routes_train=None, routes_infer=None, logp_train_V=None, logp_infer_V=None) -> dict:
    """All mismatch metrics in one dict (kl_full only when both full distributions are given)."""
    out = dict(kl=kl_k3(logp_train, logp_infer, mask), extreme_frac=extreme_frac(logp_train, logp_infer, mask),
               kl_full=None)
    if logp_train_V is not None and logp_infer_V is not None:
        out["kl_full"] = kl_full(logp_train_V, logp_infer_V, mask)
    out.update(flip_stats(routes_train, routes_infer, mask))
    return out
