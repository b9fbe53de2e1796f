"""Re-score a rollout `Batch` with the trainer: the fp32 full forward that the policy gradient is computed from.

`score` is the training-side half of the train/inference mismatch. It runs one forward over `tokens[:, :-1]`
(`valid_BT = attn_mask[:, :-1]`, so padding is invisible) and returns, per input position p, the log-prob the trainer
gives the token the engine sampled at p+1: the same indexing as `Batch.rollout_logp`, so the two line up 1:1.

  replay=False    the router's own top-k (the "no replay" arm)
  replay=True     the engine's recorded `batch.routes` (R3)
  replay=tensor   any [B, T-1, L, K] expert ids (e.g. R2: the old policy's own routes)

Log-probs use the engine's sampling temperature (logits / temperature), as the engine's `rollout_logp` does.
`score` does not switch off autograd: the trainer calls it for its loss; wrap it in `torch.no_grad()` to measure.
Top-p is not applied to either side: both log-probs are of the full tempered softmax.

`mismatch_metrics` wraps `score` into `r3.metrics.mismatch` over `batch.loss_mask`. Its flip statistics always
compare the trainer's *own* routing (a normal forward) with the rollout routes: under replay the routes used are the
rollout's by construction (0 flips), so the informative number is how many the trainer would have flipped.

Shape suffixes: B rows  T positions (T-1 scored)  V vocabulary  L MoE layers  K experts per token.
"""
import torch

from r3.batch import Batch
from r3.metrics import mismatch
from r3.model import Transformer

FULL_VOCAB_MAX = 4096  # keep the [B, T-1, V] log-softmax only up to this vocabulary size (toy: always)


def score(model: Transformer, batch: Batch, *, replay: bool | torch.Tensor = False, temperature: float = 1.0,
          keep_full: bool | None = None) -> dict:
    """Trainer forward over a rollout batch.

    Returns a dict:
      logp    [B, T-1]     log π_train(tokens[:, p+1]), 0 where `batch.loss_mask` is False
      logp_V  [B, T-1, V]  full log-softmax (None unless keep_full, default: V <= FULL_VOCAB_MAX)
      routes  [B, T-1, L, K] long, the expert ids the forward used (None for a dense model)
    """
    if isinstance(replay, torch.Tensor):
        routes_in = replay
    elif replay:
        if batch.routes is None:
            raise ValueError("replay=True but the batch has no recorded routes (dense model, or routes dropped)")
        routes_in = batch.routes
    else:
        routes_in = None
    ids_BT, valid_BT = batch.tokens[:, :-1], batch.attn_mask[:, :-1]
    logits_BTV, routes_BTLK = model(ids_BT, valid_BT=valid_BT, routes_BTLK=routes_in)
    logp_BTV = (logits_BTV.float() / temperature).log_softmax(-1)
    mask_BT = batch.loss_mask
    logp_BT = torch.where(mask_BT, logp_BTV.gather(-1, batch.tokens[:, 1:, None])[..., 0], 0.0)
    if keep_full is None:
        keep_full = logp_BTV.shape[-1] <= FULL_VOCAB_MAX
    return dict(logp=logp_BT, logp_V=logp_BTV if keep_full else None, routes=routes_BTLK)


@torch.no_grad()
def mismatch_metrics(model: Transformer, batch: Batch, replay: bool | torch.Tensor = False, *,
                     temperature: float | None = None, own_routes: torch.Tensor | None = None) -> dict:
    """`r3.metrics.mismatch` of the trainer vs the rollout engine on `batch`, plus `n_tokens`.

    kl / extreme_frac use `batch.rollout_logp`; kl_full needs `batch.rollout_logits` (engine `keep_logits=True`).
    temperature defaults to the one recorded in `batch.meta` (the engine's), else 1.0.
    Flip stats: normal-forward routes vs `batch.routes` (None for dense). Under replay that is an extra forward,
    unless `own_routes` (the `routes` of an earlier `score(..., replay=False)` on the same batch) is passed.
    """
    if temperature is None:
        temperature = float(batch.meta.get("temperature", 1.0))
    out = score(model, batch, replay=replay, temperature=temperature)
    routes_own = out["routes"]
    is_replay = isinstance(replay, torch.Tensor) or bool(replay)
    if batch.routes is not None and is_replay:
        routes_own = own_routes if own_routes is not None else score(
            model, batch, replay=False, temperature=temperature, keep_full=False)["routes"]
    m = mismatch(out["logp"], batch.rollout_logp, batch.loss_mask, routes_train=routes_own,
                 routes_infer=batch.routes, logp_train_V=out["logp_V"], logp_infer_V=batch.rollout_logits)
    m["n_tokens"] = int(batch.loss_mask.sum())
    return m
