"""Training checkpoints: written atomically, read without unpickling code.

A checkpoint holds the model, the optimizer, the engine's weights, both RNG streams (data and sampling), the step,
and the collapse guard's state, so a killed run resumes bit-identically (train.py drops metrics lines logged
after the checkpoint's step, and recomputes them).
It is one `torch.save` file of tensors and plain containers, written to `NAME.tmp` and renamed over `NAME`:
a SIGKILL mid-save leaves the previous checkpoint intact. Loading uses `weights_only=True`.
"""
import os

import torch


def save_checkpoint(path: str, *, model, optimizer, engine, generators: dict, step: int, extra: dict) -> None:
    state = dict(model=model.state_dict(), optimizer=optimizer.state_dict(), engine=engine.model.state_dict(),
                 rng={k: g.get_state() for k, g in generators.items()}, step=step, extra=extra)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str, *, model, optimizer, engine, generators: dict) -> tuple[int, dict]:
    """Restore everything in place; returns (next step, extra)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise RuntimeError(f"cannot read checkpoint {path!r}: {e}") from e
    model.load_state_dict(state["model"], strict=True)
    optimizer.load_state_dict(state["optimizer"])
    engine.model.load_state_dict(state["engine"], strict=True)
    for k, g in generators.items():
        g.set_state(state["rng"][k])
    return state["step"], state["extra"]
