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
"""
import json
import os
from dataclasses import dataclass, field, fields

import torch
from safetensors.torch import load_file, save_file

from r3.moe import RoutesError

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
    rollout_logits: torch.Tensor | None = None  # [B, T-1, V] engine logits, kept for `kl_full` when V is small
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


def save_batch(batch: Batch, out_dir: str) -> None:
    """Write tensors + manifest atomically (temp files, then rename)."""
    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: getattr(batch, k).contiguous() for k in TENSORS}
    if batch.routes is not None:
        tensors["routes"] = batch.routes.contiguous()
    manifest = dict(format="r3-batch", version=1, num_rows=len(batch), seq_len=batch.tokens.shape[1],
                    has_routes=batch.routes is not None,
                    routes_shape=None if batch.routes is None else list(batch.routes.shape),
                    routes_dtype=None if batch.routes is None else str(batch.routes.dtype), meta=batch.meta)
    tmp = os.path.join(out_dir, "batch.safetensors.tmp")
    save_file(tensors, tmp)
    os.replace(tmp, os.path.join(out_dir, "batch.safetensors"))
    tmp = os.path.join(out_dir, "manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(out_dir, "manifest.json"))


def load_batch(in_dir: str) -> Batch:
    """Read a batch written by `save_batch`, refusing anything inconsistent with a message that names it."""
    mpath, tpath = os.path.join(in_dir, "manifest.json"), os.path.join(in_dir, "batch.safetensors")
    for p in (mpath, tpath):
        if not os.path.exists(p):
            raise FileNotFoundError(f"rollout folder {in_dir!r} has no {os.path.basename(p)}")
    with open(mpath) as f:
        manifest = json.load(f)
    if manifest.get("format") != "r3-batch":
        raise ValueError(f"{mpath}: not an r3 rollout manifest (format={manifest.get('format')!r})")
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
        if list(routes.shape) != manifest["routes_shape"] or routes.shape[:2] != (B, T - 1):
            raise RoutesError(f"{tpath}: routes shape {tuple(routes.shape)} does not match the manifest "
                              f"{manifest['routes_shape']} / tokens [{B}, {T}] (want [{B}, {T - 1}, L, K])")
    return Batch(routes=routes, meta=manifest.get("meta", {}), **{k: t[k] for k in TENSORS})
