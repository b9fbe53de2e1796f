"""Helpers shared by `rollout.py` and the experiment scripts: get a model, sample a rollout batch, format tables.

Nothing here computes a metric: mismatch numbers come from `r3.score` / `r3.metrics`, so every script measures
with the same code the trainer uses.
"""
import json
import os
import sys

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from r3.batch import Batch  # noqa: E402
from r3.engine import Engine  # noqa: E402
from r3.model import PRESETS, ModelConfig, Transformer, build_model  # noqa: E402
from r3.tasks import EOS, PAD, Example, Task  # noqa: E402
from r3.warmup import load_weights, warmed_up_model  # noqa: E402


def checkpoint_config(path: str) -> ModelConfig | None:
    """The ModelConfig stored in a `save_weights` checkpoint's metadata (warm-up cache key or `cfg`), if any."""
    with safe_open(path, framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("r3", "{}"))
    cfg = meta.get("cfg") or meta.get("key", {}).get("cfg")
    return None if cfg is None else ModelConfig(**cfg)


def load_model(spec: str, *, dense: bool, task: Task, task_spec: str, warmup_steps: int, init_seed: int,
               cache_dir: str = ".cache/warmup", arch: str | None = None,
               progress: bool = True) -> tuple[Transformer, str]:
    """A toy preset (built from init_seed, then warmed up on the task, cached) or a saved safetensors checkpoint.

    Returns (model in fp32 eval mode, a one-line description of where it came from).
    A checkpoint's architecture comes from its metadata; `arch` (a preset name) is the fallback when there is none.
    """
    if spec in PRESETS:
        cfg = PRESETS[spec].dense_twin() if dense else PRESETS[spec]
        if warmup_steps > 0:
            model, path = warmed_up_model(cfg, task, task_spec, steps=warmup_steps, seed=init_seed,
                                          cache_dir=cache_dir, progress=progress)
            desc = f"preset {spec}{' (dense twin)' if dense else ''}, {warmup_steps} SFT warm-up steps on " \
                   f"{task_spec}, init seed {init_seed} ({path})"
        else:
            model, desc = build_model(cfg, init_seed), f"preset {spec}{' (dense twin)' if dense else ''}, " \
                                                       f"random init seed {init_seed}"
        return model.float().eval(), desc
    if not os.path.isfile(spec):
        raise SystemExit(f"--model {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a checkpoint file")
    cfg = checkpoint_config(spec)
    if cfg is None:
        if arch is None:
            raise SystemExit(f"{spec}: no model config in the checkpoint metadata; pass --arch PRESET")
        cfg = PRESETS[arch].dense_twin() if dense else PRESETS[arch]
    if dense and not cfg.dense:
        raise SystemExit(f"{spec} is an MoE checkpoint; --dense cannot turn it into the dense twin")
    return load_weights(Transformer(cfg), spec).float().eval(), f"checkpoint {spec}{' (dense)' if cfg.dense else ''}"


@torch.no_grad()
def rollout(model: Transformer, task: Task, *, num_prompts: int, group_size: int, dtype: str, seed: int,
            temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int | None = None,
            keep_logits: bool = False) -> tuple[Batch, list[Example]]:
    """Sample prompts from `task` (seeded), generate at rollout precision `dtype`, fill `rewards` and meta.

    One generator, seeded once, draws the prompts and then the samples: same seed, same batch, bit for bit.
    """
    g = torch.Generator().manual_seed(seed)
    examples = task.sample(num_prompts, g)
    batch = Engine(model, dtype).generate(
        [e.prompt for e in examples], max_new_tokens=max_new_tokens or task.max_new_tokens, eos_ids=(EOS,),
        pad_id=PAD, group_size=group_size, temperature=temperature, top_p=top_p, generator=g,
        keep_logits=keep_logits)
    exact = torch.zeros(len(batch), dtype=torch.bool)
    for i in range(len(batch)):
        response = batch.tokens[i][batch.response_mask[i]].tolist()
        batch.rewards[i], info = task.reward(response, examples[int(batch.group[i])])
        exact[i] = info["exact"]
    batch.meta.update(task=task.name, seed=seed, exact_frac=float(exact.float().mean()))
    return batch, examples


def fmt(x, scale: float = 1.0, digits: int = 3) -> str:
    """A table cell: '—' for None / NaN, else a compact number."""
    if x is None or x != x:
        return "—"
    v = x * scale
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
