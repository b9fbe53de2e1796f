"""The Batch: what the rollout engine hands to the trainer, in memory or on disk.

Layout (one row per sampled response; prompts left-padded, responses right-padded, one shared length T):
  tokens        [B, T]         long   prompt + response token ids
  attn_mask     [B, T]         bool   real tokens (False = padding)
  response_mask [B, T]         bool   response tokens (the EOS included)
  rollout_logp  [B, T-1]       f32    engine log-prob of tokens[:, p+1] at position p (0 off the response)
  routes        [B, T-1, L, K] int    experts the engine used for input position p (None for a dense model)
  rewards       [B]            f32    task reward per response
  group         [B]            long   which prompt a row came from (GRPO groups)

Everything per token is indexed by *input position* p = 0..T-2, whose logits score token p+1. The engine feeds
exactly positions 0..T-2 (the last sampled token is never fed), so routes are [T-1, L, K] per sequence, the
same convention as SGLang's `routed_experts`. `loss_mask = response_mask[:, 1:]` selects the positions whose
target is a response token.

On disk: `batch.safetensors` (tensors) + `manifest.json` (shapes, model/engine metadata). No pickle.
Routes are stored encoded (`r3/routing.py`; default codec `rank`, the information limit for a top-k set): a flat uint8
tensor `routes`, with the codec, shape and expert count in the safetensors header (`r3.routes_*` metadata) and
mirrored in the manifest. A set codec returns each row's ids ascending; replay does not depend on their order.
Version-1 folders (raw routes tensor) still load. `load_rollouts` reads one or many folders and validates them
against a model config, naming the folder and row of anything that does not fit. `batch_from_samples` builds a
Batch from external-engine samples (SGLang / vLLM, see `r3/routing.py`).
"""
import json
import os
from dataclasses import dataclass, field, fields

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from r3.moe import RoutesError, check_routes
from r3.routing import CODECS, DEFAULT_FILE_CODEC, EngineSample, decode_routes, encode_routes, fit_routes, \
    routes_dtype

TENSORS = ("tokens", "attn_mask", "response_mask", "rollout_logp", "rewards", "group")


@dataclass
class Batch:
    tokens: torch.Tensor
    attn_mask: torch.Tensor
    response_mask: torch.Tensor
    rollout_logp: torch.Tensor
    routes: torch.Tensor | None
    rewards: torch.Tensor
    group: torch.Tensor
    rollout_logp_V: torch.Tensor | None = None  # [B, T-1, V] engine log-probs (tempered log-softmax) for kl_full
    meta: dict = field(default_factory=dict)

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.response_mask[:, 1:]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def select(self, idx) -> "Batch":
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in kw.items():
            if isinstance(v, torch.Tensor):
                kw[k] = v[idx]
        return Batch(**kw)


def _routes_num_experts(batch: Batch, num_experts: int | None) -> int:
    """E for the codec: the argument, else `meta["num_experts"]` (the engine records it), else max id + 1."""
    if num_experts is None:
        num_experts = batch.meta.get("num_experts")
    if num_experts is None:
        num_experts = int(batch.routes.max()) + 1 if batch.routes.numel() else batch.routes.shape[-1]
    return max(int(num_experts), batch.routes.shape[-1])


def save_batch(batch: Batch, out_dir: str, *, codec: str = DEFAULT_FILE_CODEC, num_experts: int | None = None) -> None:
    """Write tensors + manifest atomically (temp files, then rename); routes encoded with `codec`."""
    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: getattr(batch, k).contiguous() for k in TENSORS}
    header, info = {}, dict(has_routes=batch.routes is not None, routes_shape=None, routes_codec=None)
    if batch.routes is not None:
        E = _routes_num_experts(batch, num_experts)
        tensors["routes"] = encode_routes(batch.routes, codec, E)
        info.update(routes_shape=list(batch.routes.shape), routes_codec=codec, routes_num_experts=E,
                    routes_nbytes=tensors["routes"].numel())
        header = {"r3.routes_codec": codec, "r3.routes_shape": json.dumps(info["routes_shape"]),
                  "r3.routes_num_experts": str(E)}
    manifest = dict(format="r3-batch", version=2, num_rows=len(batch), seq_len=batch.tokens.shape[1], **info,
                    meta=batch.meta)
    tmp = os.path.join(out_dir, "batch.safetensors.tmp")
    save_file(tensors, tmp, metadata=header)
    os.replace(tmp, os.path.join(out_dir, "batch.safetensors"))
    tmp = os.path.join(out_dir, "manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, "manifest.json"))


def _read_routes(tpath: str, payload: torch.Tensor, manifest: dict) -> torch.Tensor:
    """Decode the routes payload as its safetensors header says, refusing headers that disagree or do not parse."""
    if manifest.get("version", 1) == 1:  # raw id tensor, before codecs
        return payload
    with safe_open(tpath, "pt") as f:
        header = f.metadata() or {}
    try:
        codec = header["r3.routes_codec"]
        shape = json.loads(header["r3.routes_shape"])
        E = int(header["r3.routes_num_experts"])
    except (KeyError, ValueError, TypeError) as e:
        raise RoutesError(f"{tpath}: routes header missing or unreadable ({e!r}); header = {header}") from e
    if codec not in CODECS:
        raise RoutesError(f"{tpath}: unknown routes codec {codec!r} in the header; known: {', '.join(CODECS)}")
    if (not isinstance(shape, list) or len(shape) != 4 or not all(isinstance(s, int) and s >= 0 for s in shape)
            or shape != manifest.get("routes_shape") or codec != manifest.get("routes_codec")):
        raise RoutesError(f"{tpath}: routes header (codec {codec!r}, shape {shape}) does not match the manifest "
                          f"(codec {manifest.get('routes_codec')!r}, shape {manifest.get('routes_shape')})")
    try:
        return decode_routes(payload, codec, tuple(shape), E)
    except RoutesError as e:
        raise RoutesError(f"{tpath}: {e}") from e


def load_batch(in_dir: str) -> Batch:
    """Read a batch written by `save_batch`, refusing anything inconsistent with a message that names it."""
    mpath, tpath = os.path.join(in_dir, "manifest.json"), os.path.join(in_dir, "batch.safetensors")
    for p in (mpath, tpath):
        if not os.path.exists(p):
            raise FileNotFoundError(f"rollout folder {in_dir!r} has no {os.path.basename(p)}")
    try:
        with open(mpath) as f:
            manifest = json.load(f)
    except ValueError as e:
        raise ValueError(f"{mpath}: not valid JSON ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != "r3-batch":
        raise ValueError(f"{mpath}: not an r3 rollout manifest")
    if manifest.get("version", 1) not in (1, 2):
        raise ValueError(f"{mpath}: unsupported manifest version {manifest.get('version')!r} (this code reads 1, 2)")
    try:
        t = load_file(tpath)
    except Exception as e:  # safetensors raises its own error types for truncated or corrupt files
        raise ValueError(f"{tpath}: corrupt or truncated safetensors file ({e})") from e
    missing = [k for k in TENSORS if k not in t]
    if missing:
        raise ValueError(f"{tpath}: missing tensors {missing}")
    B, T = manifest["num_rows"], manifest["seq_len"]
    if tuple(t["tokens"].shape) != (B, T):
        raise ValueError(f"{tpath}: tokens shape {tuple(t['tokens'].shape)} != manifest ({B}, {T})")
    routes = t.get("routes")
    if manifest["has_routes"]:
        if routes is None:
            raise RoutesError(f"{tpath}: manifest says routes were recorded but the file has none")
        routes = _read_routes(tpath, routes, manifest)
        if list(routes.shape) != manifest["routes_shape"] or routes.shape[:2] != (B, T - 1):
            raise RoutesError(f"{tpath}: routes shape {tuple(routes.shape)} does not match the manifest "
                              f"{manifest['routes_shape']} / tokens [{B}, {T}] (want [{B}, {T - 1}, L, K])")
    elif routes is not None:
        raise RoutesError(f"{tpath}: the file holds routes but the manifest says none were recorded")
    return Batch(routes=routes, meta=manifest.get("meta", {}), **{k: t[k] for k in TENSORS})


def load_rollouts(path: str, cfg, *, require_routes: bool = True) -> list[Batch]:
    """Load one saved batch folder, or every batch folder below `path` (sorted), validated against `cfg`.

    cfg is a `ModelConfig`. With `require_routes` (training with --r3) every batch must carry routes that fit the
    model: [rows, T-1, num_hidden_layers, num_experts_per_tok], ids in range, K distinct ids per (position, layer).
    Errors name the folder and the row. Each Batch gets `meta["source"] = folder`.
    """
    if os.path.exists(os.path.join(path, "manifest.json")):
        dirs = [path]
    else:
        dirs = sorted(os.path.dirname(os.path.join(root, "manifest.json")) for root, _, files in os.walk(path)
                      if "manifest.json" in files)
    if not dirs:
        raise FileNotFoundError(f"no rollout folders (with manifest.json) under {path!r}")
    if require_routes and cfg.dense:
        raise RoutesError("routes cannot be replayed into a dense model (cfg.dense=True); drop --r3")
    out = []
    for d in dirs:
        b = load_batch(d)
        b.meta["source"] = d
        _validate_against(b, cfg, d, require_routes)
        out.append(b)
    return out


def _validate_against(b: Batch, cfg, where: str, require_routes: bool) -> None:
    B, T = b.tokens.shape
    if T - 1 > cfg.max_position_embeddings:
        raise ValueError(f"{where}: sequences of {T} tokens exceed max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
    bad = ((b.tokens < 0) | (b.tokens >= cfg.vocab_size)) & b.attn_mask
    if bad.any():
        r = int(bad.any(1).nonzero()[0, 0])
        raise ValueError(f"{where}: row {r} has token ids outside the vocabulary [0, {cfg.vocab_size})")
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


def batch_from_samples(samples: list[EngineSample], cfg, *, pad_id: int, meta: dict | None = None) -> Batch:
    """Lay engine samples out as our Batch (prompts left padded, outputs right padded), as Engine.generate does.

    Positions without a token get the distinct dummy ids 0..K-1 (outside loss_mask). rollout_logp is 0 where the
    engine gave no log-probs (meta["rollout_logp_missing"] lists those rows).
    """
    if not samples:
        raise ValueError("batch_from_samples needs at least one sample")
    B, K = len(samples), cfg.num_experts_per_tok
    Lp, N = max(len(s.prompt_ids) for s in samples), max(len(s.output_ids) for s in samples)
    T = Lp + N
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.bool)
    resp = torch.zeros(B, T, dtype=torch.bool)
    logp = torch.zeros(B, T - 1)
    routes = torch.arange(K).expand(B, T - 1, cfg.num_hidden_layers, K).clone()
    missing = []
    for i, s in enumerate(samples):
        p, n = len(s.prompt_ids), len(s.output_ids)
        o = Lp - p
        where = f"sample {i}"
        if n == 0:
            raise ValueError(f"{where}: no output tokens")
        fit_routes(s.routes, cfg, p + n, where)
        tokens[i, o:Lp + n] = torch.tensor(s.prompt_ids + s.output_ids)
        attn[i, o:Lp + n] = True
        resp[i, Lp:Lp + n] = True
        routes[i, o:o + p + n - 1] = s.routes
        if s.output_logp is None:
            missing.append(i)
        elif len(s.output_logp) != n:
            raise ValueError(f"{where}: {len(s.output_logp)} log-probs for {n} output tokens")
        else:
            logp[i, Lp - 1:Lp - 1 + n] = torch.tensor(s.output_logp)
    meta = dict(meta or {}, prompt_len=Lp, num_experts=cfg.num_experts, rollout_logp_missing=missing)
    return Batch(tokens=tokens, attn_mask=attn, response_mask=resp, rollout_logp=logp,
                 routes=routes.to(routes_dtype(cfg.num_experts)), rewards=torch.tensor([s.reward for s in samples]),
                 group=torch.tensor([s.group for s in samples]), meta=meta)
