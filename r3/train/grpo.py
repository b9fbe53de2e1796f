"""GRPO-family losses and the rollout-vs-train importance corrections. Each returns (value, metrics).

Shape suffixes: B rows (responses), T input positions (T-1 of the Batch: position p scores token p+1).

Advantages (`group_advantages`): A_i = (r_i − mean_g r) / (std_g r + ε) per GRPO group g (unbiased std, as TRL);
`normalize_std=False` gives Dr. GRPO's A_i = r_i − mean_g r.

Policy losses (`policy_loss`), ρ_t = π_θ(y_t) / π_old(y_t), with π_old the trainer's log-probs before the update:
  grpo     token-level clipped surrogate  −min(ρ_t A, clip(ρ_t, 1−ε_low, 1+ε_high) A), averaged over all
           response tokens of the batch ("token-mean", as DAPO/verl).
  dr_grpo  the same surrogate summed per sequence and divided by a constant (rows × max response length):
           Dr. GRPO's unbiased normalisation (use with `normalize_std=False`).
  gspo     sequence ratio s_i = exp(mean_t log ρ_t), clipped at sequence level; the token gradient uses
           s_i · π_θ(y_t)/sg[π_θ(y_t)] (GSPO-token form, equal to GSPO for a sequence-level advantage).
  seq_is   the untruncated sequence-level importance-weighted policy gradient, no clipping:
           −sg[w(y)] · A · Σ_t log π_θ(y_t), w(y) = exp Σ_t (log π_θ(y_t) − log π_rollout(y_t)), over all response
           tokens of the batch (token-mean, as grpo). w carries the whole train/inference mismatch of the sequence:
           Var[log w] ≈ 2·KL·T grows with the response length T. --is-correction applies to w(y): tis truncates it
           at C, mis drops the rows outside [1/C, C] (their tokens stay in the denominator). A w that overflows
           (log w > 88 in fp32) makes the untruncated loss non-finite, which the collapse guard reports; a dropped
           row or one with A = 0 adds nothing. Logged: seq_is/ess_frac = (Σw)² / Σw² / rows (the effective sample
           size of the raw weights, computed from log w so it cannot overflow), seq_is/max_log_w (the largest
           over mini-steps and data shards), seq_is/var_log_w (population variance over the rows).

Rollout correction (`--is-correction`), w_t = π_old(y_t) / π_rollout(y_t), the engine-vs-trainer mismatch ratio:
  tis     multiply each token's loss by min(w_t, C)                        (truncated IS, Yao et al.)
  icepop  multiply by w_t inside [1/C, C], drop tokens outside the band     (token-level mask, Ring-1T IcePop)
  mis     drop whole sequences whose geometric-mean w is outside [1/C, C], weight the rest by it (sequence-level
          masked IS, Liu et al.)
R3 reduces w_t towards 1 at the source; these corrections reweight after the fact. They compose: --r3 --is tis.
"""
import math

import torch


def group_advantages(rewards_B: torch.Tensor, group_B: torch.Tensor, *, normalize_std: bool = True,
                     eps: float = 1e-6) -> tuple[torch.Tensor, dict]:
    groups = group_B.unique()
    adv_B = torch.zeros_like(rewards_B, dtype=torch.float32)
    stds = []
    for g in groups:
        m = group_B == g
        r = rewards_B[m].float()
        std = r.std() if r.numel() > 1 else torch.tensor(0.0)
        stds.append(float(std))
        adv_B[m] = (r - r.mean()) / (std + eps) if normalize_std else r - r.mean()
    return adv_B, {"reward/group_std": sum(stds) / len(stds),
                   "reward/zero_std_frac": sum(s == 0 for s in stds) / len(stds)}


def correction_weights(old_logp_BT, rollout_logp_BT, mask_BT, *, kind: str, cap: float):
    """Per-token weights and an extra mask for the rollout correction `kind` (see module docstring)."""
    if kind == "none":
        return torch.ones_like(old_logp_BT), mask_BT, {}
    log_w = (old_logp_BT - rollout_logp_BT).detach().masked_fill(~mask_BT, 0.0)
    w = log_w.exp()
    if kind == "tis":
        return w.clamp(max=cap), mask_BT, {"is/truncated_frac": _frac(w > cap, mask_BT)}
    if kind == "icepop":
        keep = (log_w.abs() <= math.log(cap)) & mask_BT
        return w, keep, {"is/masked_frac": _frac(~keep, mask_BT)}
    if kind == "mis":
        n = mask_BT.sum(-1).clamp(min=1)
        log_seq_B = log_w.sum(-1) / n
        keep_B = log_seq_B.abs() <= math.log(cap)
        w_seq = log_seq_B.exp()[:, None].expand_as(w)
        seq_mask = mask_BT.any(-1)
        return w_seq, mask_BT & keep_B[:, None], {
            "is/masked_frac": float((~keep_B & seq_mask).sum() / seq_mask.sum().clamp(min=1))}
    raise ValueError(f"unknown is-correction {kind!r}; choose from none, tis, icepop, mis")


def _frac(x, mask) -> float:
    return float((x & mask).sum() / mask.sum().clamp(min=1))


def policy_loss(logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, adv_B: torch.Tensor, mask_BT: torch.Tensor, *,
                loss: str = "grpo", clip_low: float = 0.2, clip_high: float = 0.28,
                rollout_logp_BT: torch.Tensor | None = None, is_correction: str = "none", is_cap: float = 2.0,
                max_len: int | None = None, denominator: float | None = None) -> tuple[torch.Tensor, dict]:
    """The loss `loss` over these rows and its metrics. denominator: divide the summed loss by this (e.g. the
    `loss_denominator` summed over every data shard of the step) instead of this batch's own count."""
    mask = mask_BT.bool()
    if (is_correction != "none" or loss == "seq_is") and rollout_logp_BT is None:
        raise ValueError(f"loss {loss!r} with is-correction {is_correction!r} needs the rollout log-probs")
    if loss == "seq_is":
        return seq_is_loss(logp_BT, old_logp_BT, rollout_logp_BT, adv_B, mask, is_correction=is_correction,
                           is_cap=is_cap, denominator=denominator)
    w_BT, mask, is_metrics = correction_weights(old_logp_BT, rollout_logp_BT if rollout_logp_BT is not None
                                                else old_logp_BT, mask, kind=is_correction, cap=is_cap)
    A = adv_B[:, None]
    log_ratio = (logp_BT - old_logp_BT).masked_fill(~mask, 0.0)
    if loss == "gspo":
        n = mask.sum(-1).clamp(min=1)
        log_s_B = log_ratio.sum(-1) / n
        s_BT = (log_s_B.detach()[:, None] + logp_BT - logp_BT.detach()).exp()
        clipped = s_BT.clamp(1 - clip_low, 1 + clip_high)
        tok = -torch.minimum(s_BT * A, clipped * A) * w_BT
        per_seq = (tok * mask).sum(-1) / n
        has = mask.any(-1)
        value = per_seq[has].sum() / (has.sum().clamp(min=1) if denominator is None else denominator)
        seq_clipped = (clipped[:, 0] * A[:, 0] < s_BT[:, 0] * A[:, 0]).detach()
        clip_frac = float(seq_clipped[has].float().mean()) if has.any() else 0.0
        ratio_mean = float(log_s_B[has].detach().exp().mean()) if has.any() else 1.0
    else:
        ratio = log_ratio.exp()
        clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
        tok = -torch.minimum(ratio * A, clipped * A) * w_BT
        if loss == "grpo":
            value = (tok * mask).sum() / (mask.sum().clamp(min=1) if denominator is None else denominator)
        elif loss == "dr_grpo":
            value = (tok * mask).sum() / (mask.shape[0] * (max_len or mask.shape[1]) if denominator is None
                                          else denominator)
        else:
            raise ValueError(f"unknown loss {loss!r}; choose from grpo, dr_grpo, gspo, seq_is")
        clip_frac = _frac((clipped * A < ratio * A).detach(), mask)  # clipping active: min() took the clipped term
        ratio_mean = float(ratio.detach()[mask].mean()) if mask.any() else 1.0
    max_log_ratio = float(log_ratio.detach().abs().max()) if log_ratio.numel() else 0.0  # 0 off the mask
    return value, {"grpo/loss": float(value.detach()), "grpo/clip_frac": clip_frac, "grpo/ratio_mean": ratio_mean,
                   "grpo/max_abs_log_ratio": max_log_ratio, **is_metrics}


MAX_METRICS = ("grpo/max_abs_log_ratio", "seq_is/max_log_w")  # reduced over mini-steps and shards by max


def seq_is_loss(logp_BT, old_logp_BT, rollout_logp_BT, adv_B, mask_BT, *, is_correction: str, is_cap: float,
                denominator: float | None) -> tuple[torch.Tensor, dict]:
    """`policy_loss(loss="seq_is")`: see the module docstring."""
    if is_correction not in ("none", "tis", "mis"):
        raise ValueError(f"seq_is corrects its sequence weight with tis or mis, not {is_correction!r}")
    has = mask_BT.any(-1)
    log_w = (logp_BT - rollout_logp_BT).detach().masked_fill(~mask_BT, 0.0).sum(-1)
    w, keep, metrics = log_w.exp(), has, {}
    if is_correction == "tis":
        metrics["is/truncated_frac"] = float((w > is_cap)[has].float().mean()) if has.any() else 0.0
        w = w.clamp(max=is_cap)
    elif is_correction == "mis":
        keep = has & (log_w.abs() <= math.log(is_cap))
        metrics["is/masked_frac"] = float((~keep & has).sum() / has.sum().clamp(min=1))
    # a dropped row, or a row whose advantage is 0, adds nothing, even where w overflowed to inf (inf · 0 is NaN)
    coef_B = torch.where(keep & (adv_B != 0), w * adv_B, 0.0)
    tok = -coef_B[:, None] * logp_BT
    value = (tok * mask_BT).sum() / (mask_BT.sum().clamp(min=1) if denominator is None else denominator)
    lw = log_w[has].double()
    raw = (lw - lw.max()).exp() if len(lw) else lw  # the ESS is scale-free: shifted, exp cannot overflow
    log_ratio = (logp_BT - old_logp_BT).detach().masked_fill(~mask_BT, 0.0)
    return value, {"grpo/loss": float(value.detach()), "grpo/clip_frac": 0.0,
                   "grpo/ratio_mean": float(log_ratio.exp()[mask_BT].mean()) if mask_BT.any() else 1.0,
                   "grpo/max_abs_log_ratio": float(log_ratio.abs().max()) if log_ratio.numel() else 0.0,
                   "seq_is/ess_frac": float(raw.sum() ** 2 / (raw ** 2).sum() / len(lw)) if len(lw) else None,
                   "seq_is/max_log_w": float(lw.max()) if len(lw) else None,
                   "seq_is/var_log_w": float(lw.var(unbiased=False)) if len(lw) else None, **metrics}


def loss_denominator(old_logp_BT: torch.Tensor, rollout_logp_BT: torch.Tensor, mask_BT: torch.Tensor, *,
                     loss: str, is_correction: str = "none", is_cap: float = 2.0, max_len: int | None = None) -> float:
    """What `policy_loss` divides its sum by for these rows (before the clamp at 1): kept response tokens (grpo),
    rows × max_len (dr_grpo), or sequences with a kept token (gspo), every response token (seq_is). Summed over the
    data shards of a step, it turns per-shard losses into one loss over the whole step
    (`policy_loss(..., denominator=total)`)."""
    if loss == "seq_is":
        return float(mask_BT.sum())
    _, mask, _ = correction_weights(old_logp_BT, rollout_logp_BT, mask_BT.bool(), kind=is_correction, cap=is_cap)
    if loss == "grpo":
        return float(mask.sum())
    if loss == "dr_grpo":
        return float(mask.shape[0] * (max_len or mask.shape[1]))
    if loss == "gspo":
        return float(mask.any(-1).sum())
    raise ValueError(f"unknown loss {loss!r}; choose from grpo, dr_grpo, gspo, seq_is")
