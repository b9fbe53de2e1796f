"""Checkpoints and weights: written atomically, read without unpickling code, checked before anything is restored.

`save_checkpoint` / `load_checkpoint`: the resumable training state. A checkpoint holds the model, the optimizer,
the in-process engine's weights, both RNG streams (data and sampling), the step, and the collapse guard's state, so
a killed run resumes bit-identically (train.py drops metrics lines logged after the checkpoint's step, and
recomputes them). It is one `torch.save` file of tensors and plain containers, written to `NAME.tmp`, fsynced and
renamed over `NAME` (`r3.runs.io.atomic_write`): a SIGKILL mid-save leaves the previous checkpoint intact, and a
failed write (disk full) is one WriteError line that says so. `checkpoint_step` reads the step a file holds. A
model with a NaN or inf parameter is not saved, so a bad step never replaces a good checkpoint. Loading uses
`weights_only=True` and checks the whole file first (every section, every RNG stream, the `extra` keys the caller
needs, the model's keys and shapes, every weight a finite float: `r3.runs.validate.check_weight`), so a refused
checkpoint leaves the model, optimizer and generators untouched. Refusals raise `CheckpointFileError` (an InputError
and a RuntimeError).

`save_weights` / `load_weights`: model weights alone, as safetensors with the model config in the metadata (the
warm-up cache, and checkpoints rollout.py loads with `--model PATH`); `checkpoint_config` reads that config back.
`load_weights` refuses a tensor that is not a finite float, naming it, as the HF loader does.

`model_digest`: a SHA-256 of a model's weights (names, shapes, fp32 values), recorded by rollout.py in a batch's
manifest so that train.py --rollouts can tell whether the rollouts were sampled by the model it starts from.
"""
import hashlib
import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from r3.errors import InputError
from r3.runs.io import atomic_write
from r3.model.model import ModelConfig, Transformer
from r3.runs.validate import check_model_config, check_weight

SECTIONS = ("model", "optimizer", "engine", "rng", "step", "extra")


class CheckpointFileError(InputError, RuntimeError):
    """A training checkpoint or weights file that cannot be restored as it is. The message names the file and key."""


def save_checkpoint(path: str, *, model, optimizer, engine, generators: dict, step: int, extra: dict) -> None:
    """engine: the in-process engine (its weights are saved too), or None for a server engine (re-synced on load)."""
    bad = [k for k, v in model.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"refusing to save {path}: {len(bad)} model tensor(s) hold NaN/inf (first {bad[0]!r}); "
                         f"the previous checkpoint is kept")
    state = dict(model=model.state_dict(), optimizer=optimizer.state_dict(),
                 engine={} if engine is None else engine.model.state_dict(),
                 rng={k: g.get_state() for k, g in generators.items()}, step=step, extra=extra)
    need = sum(t.numel() * t.element_size() for t in _tensors(state))
    atomic_write(path, lambda tmp: torch.save(state, tmp), need=need)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (dict, list, tuple)):
        for v in obj.values() if isinstance(obj, dict) else obj:
            yield from _tensors(v)


def checkpoint_step(path: str) -> int | None:
    """The step a training checkpoint holds (its tensors mapped, not read), or None when there is none to read."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"])
    except Exception:  # no file, or not a checkpoint: the caller says so
        return None


def _check_state(path: str, state, model, generators: dict, require_extra) -> None:
    if not isinstance(state, dict):
        raise CheckpointFileError(f"checkpoint {path!r} holds a {type(state).__name__}, not a training checkpoint")
    for k in SECTIONS:
        if k not in state:
            raise CheckpointFileError(f"checkpoint {path!r} has no {k!r} (keys: {sorted(state)}); it cannot resume "
                                      f"a run")
        if not isinstance(state[k], int if k == "step" else dict):
            raise CheckpointFileError(f"checkpoint {path!r}: {k!r} is a {type(state[k]).__name__}")
    for k in generators:
        if k not in state["rng"]:
            raise CheckpointFileError(f"checkpoint {path!r} has no RNG state rng[{k!r}] (has "
                                      f"{sorted(state['rng'])}); a resume without it would not be bit-identical")
    for k in require_extra:
        if k not in state["extra"]:
            raise CheckpointFileError(f"checkpoint {path!r} has no extra[{k!r}] (has {sorted(state['extra'])})")
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in state["model"].items()}
    diff = [f"missing {k}" for k in want if k not in have] + [f"unexpected {k}" for k in have if k not in want]
    diff += [f"{k}: {have[k]} in the file, {want[k]} in the model" for k in want if k in have and have[k] != want[k]]
    if diff:
        raise CheckpointFileError(f"checkpoint {path!r} was written for another model (a different preset or "
                                  f"--dense?): {len(diff)} difference(s), e.g. {diff[:3]}")
    for section in ("model", "engine"):
        for k, v in state[section].items():
            check_weight(v, f"{section}.{k}", path, CheckpointFileError)
    for i, s in (state["optimizer"].get("state") or {}).items():
        for k, v in (s.items() if isinstance(s, dict) else ()):
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not torch.isfinite(v).all():
                raise CheckpointFileError(f"checkpoint {path!r}: optimizer state {k!r} of parameter {i} holds "
                                          f"NaN/inf; the run it saved had already diverged")



def load_checkpoint(path: str, *, model, optimizer, engine, generators: dict,
                    require_extra=("guard",)) -> tuple[int, dict]:
    """Restore everything in place; returns (next step, extra). Raises CheckpointFileError naming the file and the
    key of anything missing, mismatched or non-finite, before restoring anything. engine None: a server engine (not
    restored)."""
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise CheckpointFileError(f"checkpoint {path!r} is empty (0 bytes): not written by save_checkpoint, which "
                                  f"writes a temporary file and renames it; restore it from a copy")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointFileError(f"cannot read checkpoint {path!r}: {type(e).__name__}: {e}".rstrip(": ")) from e
    _check_state(path, state, model, generators, require_extra)
    model.load_state_dict(state["model"], strict=True)
    optimizer.load_state_dict(state["optimizer"])
    if engine is not None:
        engine.model.load_state_dict(state["engine"], strict=True)
    for k, g in generators.items():
        g.set_state(state["rng"][k])
    return state["step"], state["extra"]


def save_weights(model: Transformer, path: str, meta: dict | None = None) -> None:
    """safetensors, written to a temp file, fsynced and renamed, so a killed writer never leaves a half file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata={"r3": json.dumps(meta or {})}))


def load_weights(model: Transformer, path: str) -> Transformer:
    """Load a `save_weights` file; CheckpointFileError (a ValueError) naming the file when it is truncated, corrupt,
    for another model, or holds a tensor that is not a finite float (naming it)."""
    try:
        state = load_file(path)
    except Exception as e:  # safetensors raises its own error types for truncated or corrupt files
        raise CheckpointFileError(f"{path}: corrupt or truncated safetensors file ({type(e).__name__}: {e})") from e
    want = model.state_dict()
    for k, v in state.items():
        if k in want and want[k].is_floating_point():
            check_weight(v, k, path, CheckpointFileError)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointFileError(f"{path}: weights do not fit the model ({str(e)[:300]})") from e
    return model


def model_digest(model) -> str:
    """SHA-256 of every weight (name, shape, values as fp32), in state-dict order: the same weights give the same
    digest whatever device or dtype they sit on."""
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        t = v.detach().to(device="cpu", dtype=torch.float32).contiguous()
        h.update(json.dumps([k, list(t.shape)]).encode())
        h.update(t.view(-1).view(torch.uint8).numpy())
    return "sha256:" + h.hexdigest()


def checkpoint_config(path: str) -> ModelConfig | None:
    """The ModelConfig stored in a `save_weights` checkpoint's metadata (warm-up cache key or `cfg`), if any.
    Raises ValueError naming the file when the file or its config cannot be read or could not run."""
    try:
        with safe_open(path, framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("r3", "{}"))
    except Exception as e:  # safetensors' own errors for corrupt files; JSONDecodeError for the metadata
        raise CheckpointFileError(f"{path}: corrupt safetensors file or unreadable r3 metadata "
                                  f"({type(e).__name__}: {e})") from e
    cfg = meta.get("cfg") or (meta.get("key") or {}).get("cfg") if isinstance(meta, dict) else None
    if cfg is None:
        return None
    try:
        cfg = ModelConfig(**cfg)
    except TypeError as e:
        raise CheckpointFileError(f"{path}: the model config in its metadata does not fit ModelConfig ({e})") from e
    check_model_config(cfg, f"{path} (metadata cfg)")
    return cfg
