"""Re-score a rollout `Batch` with the trainer: the fp32 full forward that the policy gradient is computed from.

This is the training-side half of the train/inference mismatch. One forward over `tokens[:, :-1]`
(`valid_BT = attn_mask[:, :-1]`, so padding is invisible) gives, per input position p, the log-prob the trainer
gives the token the engine sampled at p+1: the same indexing as `Batch.rollout_logp`, so the two line up 1:1.

  token_logp       one forward → `TokenLogp(logp, logp_V, routes, entropy)`; with autograd (the update calls it)
  old_policy_pass  the step's no-grad pass: log π_old, the routes the update will replay, the trainer's own
                   routes, and every mismatch metric. train.py, rollout.py and experiments/mismatch/table.py all
                   measure the mismatch through it, so the numbers mean the same thing everywhere.
  without_pass     what the update takes from a step that runs no pass: only the routes it replays. train.py skips
                   the pass when the update reads nothing it computes (`update_reads_pass` is False: no R2, the
                   engine's π_old) and the step does not log the mismatch (--mismatch-every)
  score            `token_logp` over a Batch, zero off `loss_mask`, replaying the recorded routes on request
  forward          the trainer's forward: each GRPO group's prompt computed once (r3/model/prefix.py) when the rows
                   share it (`groups`: `batch_groups`), else the plain forward; the same numbers up to rounding.
                   Every pass above goes through it (FSDP-sharded models take the plain forward)

Replay modes: "none" (the router's own top-k), "r3" (the engine's recorded `batch.routes`), "r2" (the update
replays the routes this pass used; the pass itself routes normally).
Flip statistics always compare the trainer's *own* routing (a normal forward) with the rollout routes: under
replay the routes used are the rollout's by construction (0 flips), so the informative number is how many the
trainer would have flipped. Under "r3" that costs one more no-grad forward, unless `own_routes` is passed.

Log-probs use the engine's sampling temperature (logits / temperature), as the engine's `rollout_logp` does.
Top-p is not applied to either side: both log-probs are of the full tempered softmax.
Large vocabularies (`chunk` > 0): `chunked_logprobs` never builds [B, T, V] logits (its backward recomputes each
chunk's softmax), the entropy is computed chunk by chunk, and `logp_V` / kl_full are None.

Shape suffixes: B rows  T positions (T-1 scored)  V vocabulary  D hidden  L MoE layers  K experts per token.
"""
from typing import NamedTuple

import torch
import torch.nn.functional as F

from torch.distributed.fsdp import FSDPModule

from r3.rollout.batch import Batch
from r3.train.metrics import masked_mean, mismatch
from r3.model.model import Transformer
from r3.model.prefix import forward_shared_prefix, shared_prefix

FULL_VOCAB_MAX = 4096  # keep the [B, T-1, V] log-softmax only up to this vocabulary size (toy: always)
REPLAY_MODES = ("none", "r2", "r3")


def default_chunk(vocab_size: int) -> int:
    """Positions per lm_head chunk: 0 (full logits) for small vocabularies, else 1024."""
    return 0 if vocab_size <= FULL_VOCAB_MAX else 1024


class TokenLogp(NamedTuple):
    logp: torch.Tensor                 # [B, T-1] log π(tokens[:, p+1])
    logp_V: torch.Tensor | None        # [B, T-1, V] full log-softmax; None when chunked
    routes: torch.Tensor | None        # [B, T-1, L, K] expert ids the forward used; None when dense
    entropy: torch.Tensor | None       # [B, T-1]; None unless asked for


def batch_groups(batch: Batch, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, int | None]:
    """(group of each row, prompt length) of a Batch, or of its `rows`: what `forward` shares prompts by."""
    return (batch.group if rows is None else batch.group[rows]), batch.meta.get("prompt_len")


def forward(model: Transformer, ids_BT: torch.Tensor, valid_BT: torch.Tensor, routes, groups=None,
            return_hidden: bool = False):
    """`model(ids, valid_BT=..., routes_BTLK=..., return_hidden=...)`, with each group's prompt computed once when
    `groups` = (group_B, prompt_len) and the rows share their prompts (`r3.model.prefix.shared_prefix` checks)."""
    shared = None if groups is None or _sharded(model) else shared_prefix(ids_BT, valid_BT, *groups, routes)
    if shared is None:
        return model(ids_BT, valid_BT=valid_BT, routes_BTLK=routes, return_hidden=return_hidden)
    return forward_shared_prefix(model, ids_BT, valid_BT=valid_BT, routes_BTLK=routes, shared=shared,
                                 return_hidden=return_hidden)


def _sharded(model: Transformer) -> bool:
    """FSDP2 gathers a block's weights when the block is called; the shared forward calls its parts."""
    return isinstance(model.model.layers[0], FSDPModule)


def token_logp(model: Transformer, tokens_BT: torch.Tensor, valid_BT: torch.Tensor, routes, *, temperature: float,
               chunk: int, with_entropy: bool = False, groups=None) -> TokenLogp:
    """Trainer log-probs of tokens[:, 1:] given tokens[:, :-1], replaying `routes` when given; `groups`
    (`batch_groups`) lets `forward` compute each group's prompt once.
    chunk = 0: full logits; > 0: `chunked_logprobs`, `chunk` positions at a time."""
    inputs, targets, valid = tokens_BT[:, :-1], tokens_BT[:, 1:], valid_BT[:, :-1]
    if chunk == 0:
        logits, used = forward(model, inputs, valid, routes, groups)
        logp_V = (logits.float() / temperature).log_softmax(-1)
        ent = -(logp_V.exp() * logp_V).sum(-1) if with_entropy else None
        return TokenLogp(logp_V.gather(-1, targets[..., None])[..., 0], logp_V, used, ent)
    hidden, used = forward(model, inputs, valid, routes, groups, return_hidden=True)
    weight = model.lm_head.weight
    logp = chunked_logprobs(hidden, weight, targets, chunk=chunk, temperature=temperature)
    ent = chunked_entropy(hidden.detach(), weight.detach(), chunk=chunk, temperature=temperature) \
        if with_entropy else None
    return TokenLogp(logp, None, used, ent)


class OldPolicy(NamedTuple):
    logp: torch.Tensor | None          # [B, T-1] log π_old (not masked); None when no pass ran (`without_pass`)
    routes: torch.Tensor | None        # what the update replays: None (none), batch.routes (r3), this pass's (r2)
    own_routes: torch.Tensor | None    # the trainer's own top-k on this batch (a normal forward)
    metrics: dict                      # r3.train.metrics.mismatch + entropy, over batch.loss_mask ({} unless measured)

    def pi_old(self, batch: Batch, source: str) -> torch.Tensor:
        """log π_old for the PPO ratio: this pass's ("trainer"), or the engine's own log-probs ("engine",
        train.py --old-logp engine: the ratio then carries the whole train/inference mismatch)."""
        return self.logp if source == "trainer" else batch.rollout_logp


def update_reads_pass(replay: str, old_logp: str) -> bool:
    """Whether the update reads what the old-policy pass computes: R2 replays its routes, and the trainer's π_old is
    its log-probs. Otherwise (none or r3, with the engine's log-probs as π_old) the pass only measures."""
    return replay == "r2" or old_logp == "trainer"


def without_pass(batch: Batch, replay: str) -> OldPolicy:
    """The OldPolicy of a step that runs no pass (see `update_reads_pass`): the routes the update replays (R3: the
    engine's; none: none), no log-probs, nothing measured."""
    if replay not in ("none", "r3"):
        raise ValueError(f"replay {replay!r} reads the old-policy pass's routes; it cannot be skipped")
    return OldPolicy(None, batch.routes if replay == "r3" else None, None, {})


@torch.no_grad()
def old_policy_pass(model: Transformer, batch: Batch, *, replay: str = "none", temperature: float = 1.0,
                    chunk: int | None = None, own_routes: torch.Tensor | None = None,
                    measure: bool = True, share_prompts: bool = True) -> OldPolicy:
    """The trainer's no-grad pass over a rollout: π_old, the routes to replay, and the mismatch vs the engine.

    The forward replays the engine's routes under "r3" (π_old is then the policy the update starts from), and
    routes normally otherwise. `own_routes`: the trainer's own routes on this batch if already known (skips the
    extra forward that flip statistics need under "r3"). measure=False: π_old and the routes only (no entropy,
    no metrics, no extra forward); `metrics` is then {}. share_prompts=False: the plain forward (`forward`).
    """
    if replay not in REPLAY_MODES:
        raise ValueError(f"replay must be one of {REPLAY_MODES}, got {replay!r}")
    if replay == "r3" and batch.routes is None:
        raise ValueError("replay 'r3' but the batch has no recorded routes (dense model, or routes dropped)")
    chunk = default_chunk(model.cfg.vocab_size) if chunk is None else chunk
    groups = batch_groups(batch) if share_prompts else None
    out = token_logp(model, batch.tokens, batch.attn_mask, batch.routes if replay == "r3" else None,
                     temperature=temperature, chunk=chunk, with_entropy=measure, groups=groups)
    update_routes = {"none": None, "r3": batch.routes, "r2": out.routes}[replay]
    own = out.routes if replay != "r3" else own_routes
    if not measure:
        return OldPolicy(out.logp, update_routes, own, {})
    if own is None and replay == "r3":  # flips compare the trainer's *own* routing with the engine's
        own = forward(model, batch.tokens[:, :-1], batch.attn_mask[:, :-1], None, groups, return_hidden=True)[1]
    mask = batch.loss_mask
    metrics = mismatch(out.logp, batch.rollout_logp, mask, own, batch.routes, out.logp_V, batch.rollout_logp_V)
    metrics["entropy"] = masked_mean(out.entropy, mask)
    return OldPolicy(out.logp, update_routes, own, metrics)


def score(model: Transformer, batch: Batch, *, replay: bool | torch.Tensor = False, temperature: float = 1.0,
          keep_full: bool | None = None) -> TokenLogp:
    """Trainer forward over a rollout batch, with autograd (wrap in `torch.no_grad()` to measure).

    replay: False (the router's own top-k), True (the recorded `batch.routes`), or any [B, T-1, L, K] ids.
    Returns `TokenLogp` with `logp` zeroed off `batch.loss_mask`; `logp_V` unless keep_full is False (default:
    kept when V <= FULL_VOCAB_MAX); no entropy.
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
    out = token_logp(model, batch.tokens, batch.attn_mask, routes_in, temperature=temperature,
                     chunk=0 if keep_full else 1024, groups=batch_groups(batch))
    return out._replace(logp=torch.where(batch.loss_mask, out.logp, 0.0))


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


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_ND, w_VD, targets_N, chunk, temperature):
        logp, lse = torch.empty(h_ND.shape[0], device=h_ND.device), torch.empty(h_ND.shape[0], device=h_ND.device)
        for s in range(0, h_ND.shape[0], chunk):
            z = F.linear(h_ND[s:s + chunk], w_VD).float() / temperature
            lse[s:s + chunk] = z.logsumexp(-1)
            logp[s:s + chunk] = z.gather(-1, targets_N[s:s + chunk, None])[:, 0] - lse[s:s + chunk]
        ctx.save_for_backward(h_ND, w_VD, targets_N, lse)
        ctx.chunk, ctx.temperature = chunk, temperature
        return logp

    @staticmethod
    def backward(ctx, g_N):
        h_ND, w_VD, targets_N, lse = ctx.saved_tensors
        gh = torch.empty_like(h_ND) if ctx.needs_input_grad[0] else None
        gw = torch.zeros(w_VD.shape, dtype=torch.float32, device=w_VD.device) if ctx.needs_input_grad[1] else None
        for s in range(0, h_ND.shape[0], ctx.chunk):
            h = h_ND[s:s + ctx.chunk]
            z = F.linear(h, w_VD).float() / ctx.temperature
            dz = -(z - lse[s:s + ctx.chunk, None]).exp()  # d logp / dz = onehot − softmax
            dz.scatter_add_(-1, targets_N[s:s + ctx.chunk, None], torch.ones_like(dz[:, :1]))
            dz = (dz * (g_N[s:s + ctx.chunk, None] / ctx.temperature)).to(w_VD.dtype)
            if gh is not None:
                gh[s:s + ctx.chunk] = dz @ w_VD
            if gw is not None:
                gw += (dz.T @ h).float()
        return gh, None if gw is None else gw.to(w_VD.dtype), None, None, None


def chunked_logprobs(hidden_BTD: torch.Tensor, lm_head_weight: torch.Tensor, targets_BT: torch.Tensor,
                     chunk: int = 1024, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(hidden · Wᵀ / temperature)[target], [B, T] fp32, computed `chunk` positions at a time.

    Equal to `(hidden @ W.T).float().div(temperature).log_softmax(-1).gather(-1, targets)` and its gradients, but
    the largest temporary is [chunk, V] in the forward and in the backward.
    """
    B, T, D = hidden_BTD.shape
    if targets_BT.shape != (B, T):
        raise ValueError(f"targets shape {tuple(targets_BT.shape)} != hidden's [B, T] = [{B}, {T}]")
    if lm_head_weight.shape[1] != D:
        raise ValueError(f"lm_head weight {tuple(lm_head_weight.shape)} does not take hidden size {D}")
    logp_N = _ChunkedLogprobs.apply(hidden_BTD.reshape(B * T, D), lm_head_weight, targets_BT.reshape(-1).long(),
                                    chunk, temperature)
    return logp_N.view(B, T)
