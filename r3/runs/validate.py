"""Checks that run before any work: a rollout batch's fields, a batch against a model, a model config.

Each check raises with a message that names where the problem is (folder, field, row) and what was expected, so a
bad input stops a run at load instead of crashing deep in step 0 or, worse, training on it.
  check_batch_fields(b, where)            model-free: dtypes, shapes, a 0-row batch, masks, finite rewards,
                                          log-probs finite and <= LOGP_TOL on the response, `check_meta`
  check_batch_model(b, cfg, where, ...)   against a ModelConfig: positions, vocabulary (pad ids included), routes
                                          shape / ids / the recorded expert count
  check_model_config(cfg, where)          positive integer sizes, top_k <= num_experts, heads divide, ...
  check_weight(t, name, where)            a weight tensor as read from a file: a float dtype where a float parameter
                                          belongs (no silent cast of integers or unscaled fp8), every value finite
Command-line flags are checked against their domains in `r3/train/config.py`.

Left out on purpose: the meaning of a batch (are the rewards right for the task, were the log-probs computed at the
temperature the manifest says). A checksum (r3/rollout/batch.py) guards the bytes; nothing here can guard the semantics.
"""
import math

import torch

from r3.errors import InputError
from r3.model.moe import RoutesError, check_routes

LOGP_TOL = 1e-4  # a log-prob above this is not a log-prob (log-softmax rounding stays far below it)
DTYPES = dict(tokens=torch.int64, attn_mask=torch.bool, response_mask=torch.bool, rollout_logp=torch.float32,
              rewards=torch.float32, group=torch.int64)


def _first_row(bad_BX: torch.Tensor) -> int:
    return int(bad_BX.reshape(bad_BX.shape[0], -1).any(1).nonzero()[0, 0])


def check_batch_fields(b, where: str) -> None:
    """Raise InputError naming the field (and row, position) of anything that is not a well-formed Batch."""
    check_meta(b.meta, where)
    for name, dtype in DTYPES.items():
        t = getattr(b, name)
        if not isinstance(t, torch.Tensor) or t.dtype != dtype:
            raise InputError(f"{where}: field {name!r} is {getattr(t, 'dtype', type(t).__name__)}, expected {dtype}")
    if b.tokens.dim() != 2:
        raise InputError(f"{where}: field 'tokens' has shape {tuple(b.tokens.shape)}, expected [rows, T]")
    B, T = b.tokens.shape
    if B == 0:
        raise InputError(f"{where}: the batch has 0 rows")
    if T < 2:
        raise InputError(f"{where}: sequences of {T} token(s); a prompt and a response need at least 2")
    want = dict(attn_mask=(B, T), response_mask=(B, T), rollout_logp=(B, T - 1), rewards=(B,), group=(B,))
    for name, shape in want.items():
        if tuple(getattr(b, name).shape) != shape:
            raise InputError(f"{where}: field {name!r} has shape {tuple(getattr(b, name).shape)}, expected "
                             f"{list(shape)} for tokens [{B}, {T}]")
    if not torch.isfinite(b.rewards).all():
        r = int((~torch.isfinite(b.rewards)).nonzero()[0, 0])
        raise InputError(f"{where}: field 'rewards' row {r} is {float(b.rewards[r])} (rewards must be finite)")
    if (b.group < 0).any():
        raise InputError(f"{where}: field 'group' row {int((b.group < 0).nonzero()[0, 0])} is negative")
    on_pad = b.response_mask & ~b.attn_mask
    if on_pad.any():
        r = _first_row(on_pad)
        raise InputError(f"{where}: field 'response_mask' row {r} marks padding (position "
                         f"{int(on_pad[r].nonzero()[0, 0])}) as a response token")
    empty = ~b.response_mask[:, 1:].any(1)
    if empty.any():
        raise InputError(f"{where}: field 'response_mask' row {int(empty.nonzero()[0, 0])} has no response token "
                         f"after position 0 (nothing to train on)")
    logp, mask = b.rollout_logp, b.response_mask[:, 1:]
    bad = mask & ~torch.isfinite(logp)
    if bad.any():
        r = _first_row(bad)
        raise InputError(f"{where}: field 'rollout_logp' row {r} is non-finite on the response (position "
                         f"{int(bad[r].nonzero()[0, 0])})")
    bad = mask & (logp > LOGP_TOL)
    if bad.any():
        r = _first_row(bad)
        p = int(bad[r].nonzero()[0, 0])
        raise InputError(f"{where}: field 'rollout_logp' row {r} position {p} is {float(logp[r, p]):.4g} > 0: "
                         f"not a log-probability")


def check_meta(meta, where: str) -> None:
    """The manifest `meta` fields code reads: temperature (a number >= 0; 0 = greedy), num_experts (an int >= 1)."""
    if not isinstance(meta, dict):
        raise InputError(f"{where}: meta is a {type(meta).__name__}, expected an object")
    t = meta.get("temperature")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0):
        raise InputError(f"{where}: meta.temperature is {t!r}, expected a number >= 0 (the engine's sampling "
                         f"temperature; 0 = greedy)")
    e = meta.get("num_experts")
    if e is not None and (isinstance(e, bool) or not isinstance(e, int) or e < 1):
        raise InputError(f"{where}: meta.num_experts is {e!r}, expected an integer >= 1")


def check_batch_model(b, cfg, where: str, *, require_routes: bool, num_experts: int | None = None) -> None:
    """Raise unless `b` fits the model `cfg` (a ModelConfig). num_experts: the expert count the routes were
    encoded for (the routes header), compared with cfg.num_experts like meta["num_experts"]."""
    B, T = b.tokens.shape
    if T - 1 > cfg.max_position_embeddings:
        raise InputError(f"{where}: sequences of {T} tokens (the model is fed {T - 1} positions) exceed "
                         f"max_position_embeddings {cfg.max_position_embeddings}")
    bad = (b.tokens < 0) | (b.tokens >= cfg.vocab_size)  # padding is fed to the embedding too
    if bad.any():
        r = _first_row(bad)
        p = int(bad[r].nonzero()[0, 0])
        kind = "token id" if b.attn_mask[r, p] else "pad id"
        raise InputError(f"{where}: field 'tokens' row {r} position {p}: {kind} {int(b.tokens[r, p])} is outside "
                         f"the vocabulary [0, {cfg.vocab_size})")
    if b.routes is None or cfg.dense:  # a dense model has no router: any routes are unused
        if require_routes and not cfg.dense:
            raise RoutesError(f"{where}: rows 0..{B - 1} have no routes (recorded without routes?); "
                              f"R3 replay needs them")
        return
    L, K, E = cfg.num_hidden_layers, cfg.num_experts_per_tok, cfg.num_experts
    if tuple(b.routes.shape[2:]) != (L, K):
        raise RoutesError(f"{where}: routes are [{B}, {T - 1}, {b.routes.shape[2]}, {b.routes.shape[3]}] "
                          f"(layers, k) but the model has {L} layers and top-{K}; every row is affected")
    try:
        check_routes(b.routes, batch=B, seq=T - 1, num_layers=L, top_k=K, num_experts=E)
    except RoutesError:
        for r in range(B):  # find the first bad row to name it
            try:
                check_routes(b.routes[r:r + 1], batch=1, seq=T - 1, num_layers=L, top_k=K, num_experts=E)
            except RoutesError as e:
                raise RoutesError(f"{where}: row {r} (group {int(b.group[r])}): {e}") from e
        raise
    recorded = b.meta.get("num_experts")
    if recorded is not None and recorded != E:
        raise RoutesError(f"{where}: routes were recorded on a model with {recorded} experts (meta.num_experts) "
                          f"but this model has {E}: rollouts from another model")
    if num_experts is not None and num_experts > E:
        raise RoutesError(f"{where}: routes were encoded for {num_experts} experts (routes header) but this model "
                          f"has {E}: rollouts from another model")


FP8 = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
       if hasattr(torch, n)}


def check_weight(t: torch.Tensor, name: str, where: str, error=InputError) -> None:
    """Raise `error` (an InputError) naming `name` unless the tensor read from `where` can become a float parameter
    without a silent change: a float dtype (an integer or bool tensor would be cast, an fp8 one needs the scales of a
    quantised checkpoint), and every value finite."""
    if not isinstance(t, torch.Tensor):
        raise error(f"{where}: {name!r} is a {type(t).__name__}, not a tensor")
    if not t.is_floating_point() or t.dtype in FP8:
        why = "needs the scales of a quantised checkpoint" if t.dtype in FP8 else "would be cast to a float silently"
        raise error(f"{where}: tensor {name!r} is {t.dtype}, where a float weight belongs ({why})")
    if not torch.isfinite(t).all():
        bad = ~torch.isfinite(t)
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise error(f"{where}: tensor {name!r} holds {int(bad.sum())} non-finite value(s) (first at index "
                         f"{list(first)}: {float(t[first])}); the weights are damaged")


def check_model_config(cfg, where: str) -> None:
    """Raise ValueError naming the field of a ModelConfig that no forward pass could run with."""
    sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim", "moe_intermediate_size", "num_experts", "num_experts_per_tok", "max_position_embeddings")
    for name in sizes:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{where}: {name}={v!r} must be a positive integer")
    for name in ("rope_theta", "rms_norm_eps"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InputError(f"{where}: {name}={v!r} must be a positive finite number")
    if cfg.num_experts_per_tok > cfg.num_experts:
        raise InputError(f"{where}: num_experts_per_tok={cfg.num_experts_per_tok} > num_experts={cfg.num_experts} "
                         f"(top-k cannot pick more experts than there are)")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise InputError(f"{where}: num_attention_heads={cfg.num_attention_heads} is not a multiple of "
                         f"num_key_value_heads={cfg.num_key_value_heads}")
    if cfg.head_dim % 2:
        raise InputError(f"{where}: head_dim={cfg.head_dim} must be even (RoPE rotates pairs)")
