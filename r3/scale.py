"""train.py's path from the toy model to a real one: HF checkpoint in, FSDP2 when torchrun launched us, data shards
spread over ranks, chunked log-probs, step metrics reduced over ranks, HF checkpoint out.

Data shards (`--shards S`): each step's prompts are drawn from one data generator that every rank holds in the same
state, then cut into S equal shards. Shard s is rolled out with its own sampling generator (`shard_generator_name`)
and belongs to rank s mod world_size. The loss of every shard is divided by the *step's* denominator (summed over
all shards, `r3.grpo.loss_denominator`), so one process that gradient-accumulates S shards and W processes that
each take S / W of them compute the same gradient; with FSDP, which averages gradients over ranks, each rank
scales its loss by W. Same --shards → same data, samples and (up to float summation order) the same run at any
world size. With S = 1 and one process, the step is the original toy loop, bit for bit.

Step metrics are weighted means over shards (`global_mean`): mismatch metrics and entropy weigh by response
tokens, reward and lengths by rows, group statistics by groups, loss metrics by the loss denominator. They are
reduced over ranks, so every rank holds the global numbers (and the collapse guard decides the same everywhere).

Log-probs: with `chunk` > 0 the trainer never builds [B, T, V] logits: `model(..., return_hidden=True)` then
`r3.memory.chunked_logprobs`, and the entropy is computed chunk by chunk under no_grad. `kl_full` needs the
engine's full distribution, which is not kept then, so it is None.

The in-process `Engine` keeps a full plain copy of the weights on every rank and is re-synced from a gathered full
state dict after each step: right for toy-sized models and tests, not for 30B (use an external engine there).
"""
import math
import os
import shutil

import torch

from r3.engine import Engine
from r3.fsdp import (all_reduce_sum, apply_fsdp, gather_full_state_dict, is_distributed,
                     load_full_state_dict_broadcast, meta_model)
from r3.hf import load_config, load_pretrained, save_pretrained
from r3.model import Transformer

FSDP_PARAM_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def shard_generator_name(shard: int) -> str:
    """Shard 0 samples with the toy loop's `sample` generator, so --shards 1 is the toy loop unchanged."""
    return "sample" if shard == 0 else f"sample{shard}"


def shard_seed(seed: int, shard: int) -> int:
    return seed + 1 + 1_000_003 * shard


def my_shards(num_shards: int, rank: int, world: int) -> list[int]:
    if num_shards % world:
        raise ValueError(f"--shards {num_shards} is not a multiple of the world size {world}: every rank needs "
                         f"the same number of shards (FSDP forwards are collective)")
    return list(range(rank, num_shards, world))


def load_policy(path: str, *, world: int, device: torch.device, rollout_dtype: str, fsdp_param_dtype: str = "bf16",
                activation_checkpointing: bool = False) -> tuple[Transformer, Engine, Transformer | None]:
    """(trainer, engine, plain copy or None) from an HF checkpoint folder.

    One process: the trainer is the fp32 model and the engine copies it. Under torchrun (world > 1): the trainer
    is built on meta, sharded with FSDP2 (fp32 master weights, `fsdp_param_dtype` compute, fp32 reduce), and
    filled by a broadcast from rank 0; every rank also loads a plain fp32 copy that feeds the engine (toy scale).
    """
    if world == 1:
        model = load_pretrained(path, dtype=torch.float32, device=device)
        return model, Engine(model, rollout_dtype), None
    plain = load_pretrained(path, dtype=torch.float32, device=device)
    cfg, _ = load_config(path)
    model = apply_fsdp(meta_model(cfg), mp=True, param_dtype=FSDP_PARAM_DTYPES[fsdp_param_dtype],
                       activation_checkpointing=activation_checkpointing)
    model.to_empty(device=device)
    rank = torch.distributed.get_rank()
    load_full_state_dict_broadcast(model, path if rank == 0 else None)
    return model, Engine(plain, rollout_dtype), plain


def sync_engine(model: Transformer, engine: Engine, plain: Transformer | None) -> None:
    """Weight sync trainer → engine; under FSDP through a full state dict gathered on every rank."""
    if plain is None:
        engine.sync(model)
        return
    plain.load_state_dict(gather_full_state_dict(model, rank0_only=False))
    engine.sync(plain)


def global_sum(x: float) -> float:
    """Sum of a float over ranks (float64 on the wire; the value itself without a process group)."""
    if not is_distributed():
        return x
    return all_reduce_sum(torch.tensor(x, dtype=torch.float64, device=_wire_device())).item()


def global_mean(parts: list[tuple[dict, float]]) -> dict:
    """Per key, Σ value·weight / Σ weight over this rank's parts and then over all ranks.

    parts: (metrics, weight) pairs with the same keys everywhere. A None value stays None (e.g. kl_full when not
    computed); a part of weight 0 is skipped (its NaN means "no tokens"); no weight at all gives NaN.
    One part in one process is returned unchanged, so the single-shard toy loop logs exactly what it did before.
    """
    keys = list(parts[0][0])
    if len(parts) == 1 and not is_distributed():
        return dict(parts[0][0])
    acc = torch.zeros(2, len(keys), dtype=torch.float64)
    for metrics, w in parts:
        for i, k in enumerate(keys):
            if metrics[k] is not None and w > 0:
                acc[0, i] += float(metrics[k]) * w
                acc[1, i] += w
    if is_distributed():
        acc = all_reduce_sum(acc.to(_wire_device())).cpu()
    return {k: None if parts[0][0][k] is None else (acc[0, i] / acc[1, i]).item() if acc[1, i] > 0 else math.nan
            for i, k in enumerate(keys)}


def _wire_device() -> torch.device:
    """NCCL reduces CUDA tensors only; gloo takes CPU tensors."""
    backend = torch.distributed.get_backend()
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def save_hf_checkpoint(model: Transformer, path: str, *, dtype: torch.dtype | None) -> None:
    """Gather the full weights (every rank must call this) and write them on rank 0 in HF layout: PATH.tmp, then
    swapped in for PATH. `dtype`: cast while writing (None keeps fp32). Weights only: no optimizer, no RNG."""
    sd = gather_full_state_dict(model, rank0_only=True)
    if is_distributed() and torch.distributed.get_rank() != 0:
        return
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, tmp, state_dict=sd, dtype=dtype)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
