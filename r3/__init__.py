"""r3: a pure-PyTorch research reference for Rollout Routing Replay (R3) in MoE reinforcement learning.

The code lives in wings, bottom to top; a module imports r3.errors, its own wing and the wings below it, never one
above (tests/test_layout.py holds this order):
  model/    the Transformer and its presets, the MoE block with record and replay, route codecs, serving numerics
  runs/     what a run leaves on disk: atomic writes, validation, checkpoints, run folders, provenance, plots
  scale/    HF checkpoints in and out, FSDP2, the memory plan
  tasks/    the toy tasks and the JSONL task
  rollout/  the engine, the batch, engine formats, the remote clients
  train/    config, collection, scoring, losses, metrics, evaluation, fidelity, the guard, the warm-up, launch
  tools/    the route checker, the inspector, the stand-in server
errors.py holds the error types every wing uses. check.py, inspect.py, plots.py and serve.py are command entry
points, no code: each calls its wing's `main`, so that `python -m r3.check` and the others keep their names.
docs/architecture.md is the map. The names below stay importable as `from r3 import ...`.
"""
from r3.model.model import ModelConfig, PRESETS, Transformer, build_model  # noqa: F401
from r3.model.moe import RoutesError  # noqa: F401
from r3.scale.hf import CheckpointError, load_pretrained, load_tokenizer, save_pretrained  # noqa: F401
