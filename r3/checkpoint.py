"""Checkpoints and weights: written atomically, read without unpickling code.

`save_checkpoint` / `load_checkpoint`: the resumable training state.
A checkpoint holds the model, the optimizer, the engine's weights, both RNG streams (data and sampling), the step,
and the collapse guard's state, so a killed run resumes bit-identically (train.py drops metrics lines logged
after the checkpoint's step, and recomputes them).
It is one `torch.save` file of tensors and plain containers, written to `NAME.tmp` and renamed over `NAME`:
a SIGKILL mid-save leaves the previous checkpoint intact. Loading uses `weights_only=True`.

`save_weights` / `load_weights`: model weights alone, as safetensors with the model config in the metadata (the
warm-up cache, and checkpoints rollout.py can load by path); `checkpoint_config` reads that config back.
"""
import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from r3.io import atomic_write
from r3.model import ModelConfig, Transformer


def save_checkpoint(path: str, *, model, optimizer, engine, generators: dict, step: int, extra: dict) -> None:
    """engine: the in-process engine (its weights are saved too), or None for a server engine (re-synced on load)."""
    state = dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                 engine=None if engine is None else engine.model.state_dict(),
                 rng={k: g.get_state() for k, g in generators.items()}, step=step, extra=extra)
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: str, *, model, optimizer, engine, generators: dict) -> tuple[int, dict]:
    """Restore everything in place; returns (next step, extra)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise RuntimeError(f"cannot read checkpoint {path!r}: {e}") from e
    model.load_state_dict(state["model"], strict=True)
    optimizer.load_state_dict(state["optimizer"])
    if engine is not None:
        engine.model.load_state_dict(state["engine"], strict=True)
    for k, g in generators.items():
        g.set_state(state["rng"][k])
    return state["step"], state["extra"]


def save_weights(model: Transformer, path: str, meta: dict | None = None) -> None:
    """safetensors, written to a temp file and renamed, so a killed writer never leaves a half file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata={"r3": json.dumps(meta or {})}))


def load_weights(model: Transformer, path: str) -> Transformer:
    model.load_state_dict(load_file(path), strict=True)
    return model


def checkpoint_config(path: str) -> ModelConfig | None:
    """The ModelConfig stored in a `save_weights` checkpoint's metadata (warm-up cache key or `cfg`), if any."""
    with safe_open(path, framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("r3", "{}"))
    cfg = meta.get("cfg") or meta.get("key", {}).get("cfg")
    return None if cfg is None else ModelConfig(**cfg)
