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
import torch.nn.functional as F

from r3.batch import Batch
from r3.memory import chunked_logprobs
from r3.metrics import mismatch
from r3.model import Transformer

FULL_VOCAB_MAX = 4096  # keep the [B, T-1, V] log-softmax only up to this vocabulary size (toy: always)


def token_logp(model: Transformer, tokens_BT: torch.Tensor, valid_BT: torch.Tensor, routes, *, temperature: float,
               chunk: int, with_entropy: bool = False):
    """Trainer log-probs of tokens[:, 1:] given tokens[:, :-1]: (logp [B, T-1], full log-softmax [B, T-1, V] or
    None when chunked, routes used, entropy [B, T-1] or None). chunk = 0: full logits; > 0: `chunked_logprobs`."""
    inputs, targets, valid = tokens_BT[:, :-1], tokens_BT[:, 1:], valid_BT[:, :-1]
    if chunk == 0:
        logits, used = model(inputs, valid_BT=valid, routes_BTLK=routes)
        logp_V = (logits.float() / temperature).log_softmax(-1)
        ent = -(logp_V.exp() * logp_V).sum(-1) if with_entropy else None
        return logp_V.gather(-1, targets[..., None])[..., 0], logp_V, used, ent
    hidden, used = model(inputs, valid_BT=valid, routes_BTLK=routes, return_hidden=True)
    weight = model.lm_head.weight
    logp = chunked_logprobs(hidden, weight, targets, chunk=chunk, temperature=temperature)
    ent = chunked_entropy(hidden.detach(), weight.detach(), chunk=chunk, temperature=temperature) \
        if with_entropy else None
    return logp, None, used, ent


@torch.no_grad()
def chunked_entropy(hidden_BTD: torch.Tensor, weight_VD: torch.Tensor, *, chunk: int,
                    temperature: float = 1.0) -> torch.Tensor:
    """Shannon entropy [B, T] of softmax(hidden · Wᵀ / temperature), `chunk` positions at a time."""
    B, T, D = hidden_BTD.shape
    h_ND, out = hidden_BTD.reshape(B * T, D), torch.empty(B * T, device=hidden_BTD.device)
    for s in range(0, B * T, chunk):
        lp = (F.linear(h_ND[s:s + chunk], weight_VD).float() / temperature).log_softmax(-1)
        out[s:s + chunk] = -(lp.exp() * lp).sum(-1)
    return out.view(B, T)


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
    if keep_full is None:
        keep_full = model.cfg.vocab_size <= FULL_VOCAB_MAX
    logp_BT, logp_BTV, routes_BTLK, _ = token_logp(model, batch.tokens, batch.attn_mask, routes_in,
                                                   temperature=temperature, chunk=0 if keep_full else 1024)
    return dict(logp=torch.where(batch.loss_mask, logp_BT, 0.0), logp_V=logp_BTV, routes=routes_BTLK)


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
