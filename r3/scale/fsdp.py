"""FSDP2 for the Transformer: process-group setup, sharding, full-state-dict load/save, DTensor-safe clipping.

`torchrun --nproc_per_node=N train.py --model PATH` runs this sequence (tests/fsdp_worker.py is a small working
example on CPU/gloo):

    rank, world, device = setup_distributed()
    model = meta_model(cfg)                                    # no memory yet
    apply_fsdp(model, mp=True, activation_checkpointing=True)  # fully_shard each block, then the root
    model.to_empty(device=device)                              # allocate only this rank's shards
    load_full_state_dict_broadcast(model, PATH if rank == 0 else None)
    ... forward / backward ...
    grad_norm = clip_grad_norm(model.parameters(), 1.0)        # a plain float, same on every rank
    sd = gather_full_state_dict(model)                         # full tensors on rank 0 ({} elsewhere)

Choices: one `fully_shard` per block (all-gather / reduce-scatter unit = one block) and one for the root
(embeddings, final norm, lm_head). Mixed precision is bf16 compute over fp32 sharded master params, with fp32
gradient reduction. Activation checkpointing uses the composable `checkpoint`, which keeps parameter names
unchanged, so state dicts stay HF-named. The root is not resharded after forward (FSDP2's default), so
`model.lm_head.weight` is the full tensor between forward and backward, as `chunked_logprobs` needs.

train.py's distribution lives here too, behind helpers that are the identity in one process: `load_policy` (the
trainer, sharded under torchrun, plus a plain copy that feeds an in-process engine), `sync_engine`, `global_sum` /
`global_mean` (step metrics reduced over ranks, so the collapse guard decides the same everywhere), `global_max` (a
stop signal, so every rank stops at the same step) and `save_hf_checkpoint`. The in-process engine keeps a full
plain copy of the weights on every rank, re-synced from a gathered full state dict after each step: right for
toy-sized models and tests, not for 30B (use an external engine there).

Left out on purpose: tensor/expert parallelism, HSDP, CPU offload of parameters, and sharded (DCP) checkpoints.
Loading broadcasts from rank 0, so rank 0 needs host memory for the whole model in the checkpoint's dtype
(~61 GB in bf16 for Qwen3-30B-A3B); the other ranks read nothing.
"""
import math
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from r3.scale.hf import load_config, load_pretrained, read_state_dict, save_pretrained
from r3.runs.io import atomic_write
from r3.model.model import ModelConfig, Transformer

FSDP_PARAM_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def setup_distributed(backend: str | None = None) -> tuple[int, int, torch.device]:
    """(rank, world_size, device). Under torchrun: init the process group (NCCL on GPU, gloo on CPU) and pick this
    rank's GPU. Without torchrun: (0, 1, cuda:0 or cpu) and no process group."""
    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda", 0) if cuda else torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if cuda else "gloo"))
    return dist.get_rank(), dist.get_world_size(), device


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (identity without a process group). Returns the reduced tensor."""
    if is_distributed():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def meta_model(cfg: ModelConfig) -> Transformer:
    """The model with parameters on the `meta` device: shapes only, no memory, nothing initialised."""
    with torch.device("meta"):
        return Transformer(cfg)


def apply_fsdp(model: Transformer, *, mp: bool = True, param_dtype: torch.dtype = torch.bfloat16,
               reduce_dtype: torch.dtype = torch.float32, activation_checkpointing: bool = False,
               reshard_after_forward: bool = True) -> Transformer:
    """FSDP2 in place: each block is its own shard group, then the root. mp=False keeps params in their dtype."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype) if mp else MixedPrecisionPolicy()
    if activation_checkpointing:
        from torch.distributed._composable import checkpoint
    for block in model.model.layers:
        if activation_checkpointing:
            checkpoint(block)
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=policy, reshard_after_forward=False)  # lm_head stays gathered until backward
    return model


def load_full_state_dict_broadcast(model: Transformer, path_or_state: str | dict | None, *,
                                   dtype: torch.dtype | None = None) -> None:
    """Fill a sharded (possibly `to_empty`) model from a full state dict that only rank 0 reads.

    path_or_state on rank 0: an HF checkpoint folder (read with the strict loader of `r3.scale.hf`) or a full state
    dict in our names; on other ranks it is ignored (pass None). Each rank keeps only its shards.
    dtype: what rank 0 reads the file as; None = the checkpoint's stored dtype (bf16 for Qwen3: half the host
    memory of fp32). The values are then copied into the model's own (e.g. fp32 master) parameters.
    """
    rank = dist.get_rank() if is_distributed() else 0
    sd = {}
    if rank == 0:
        if path_or_state is None:
            raise ValueError("rank 0 needs the checkpoint path or a full state dict")
        if isinstance(path_or_state, str):
            dtype = dtype or load_config(path_or_state)[1] or torch.float32
            sd = read_state_dict(path_or_state, model, dtype=dtype)
        else:
            sd = path_or_state
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=is_distributed(), strict=True)
    set_model_state_dict(model, sd, options=opts)


def gather_full_state_dict(model: Transformer, *, rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU tensors in our names: on rank 0 only ({} elsewhere), or on every rank.

    Every rank must call it (it all-gathers). Write it with `r3.scale.hf.save_pretrained(model, path, state_dict=sd)`.
    rank0_only=False puts a full copy on every rank (on the GPU first): fine for toy models and for syncing an
    in-process `Engine`, not for a 30B model.
    """
    if not is_distributed():
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if rank0_only:
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.cpu() for k, v in sd.items()}


@torch.no_grad()
def clip_grad_norm(params, max_norm: float, norm_type: float = 2.0) -> float:
    """Clip gradients to a global norm over all ranks; return that norm (before clipping) as a float.

    The norm is computed in one order at any world size: each parameter's norm over its whole gradient, then the
    norm of those norms, exactly as `torch.nn.utils.get_total_norm` does in one process (the same numbers, bit for
    bit). With FSDP2 a gradient is a DTensor sharded over ranks, and the norm of the shards' norms rounds
    differently from the norm of the whole tensor: the clip coefficient would differ in its last bits, and Adam,
    which normalises each coordinate, carries that into the weights. So each sharded gradient is all-gathered,
    one parameter at a time, and its norm taken whole: the cost is one all-gather of the gradients per optimizer
    step (as much traffic as one all-gather of the fp32 parameters) and one parameter's full gradient in memory at
    a time (1.2 GB for Qwen3-30B-A3B's embedding).
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    norms = [torch.linalg.vector_norm(g.full_tensor() if isinstance(g, DTensor) else g, norm_type)
             for g in (p.grad for p in params)]
    total = torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]), norm_type)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def load_policy(path: str, *, world: int, device: torch.device, fsdp_param_dtype: str = "bf16",
                activation_checkpointing: bool = False,
                plain_copy: bool = True) -> tuple[Transformer, Transformer | None]:
    """(trainer, plain copy or None) from an HF checkpoint folder.

    One process: the trainer is the fp32 model (the engine copies it). Under torchrun (world > 1): the trainer is
    built on meta, sharded with FSDP2 (fp32 master weights, `fsdp_param_dtype` compute, fp32 reduce), and filled
    by a broadcast from rank 0; with `plain_copy` every rank also loads a plain fp32 copy that feeds an in-process
    engine (toy scale; a server engine needs none).
    """
    if world == 1:
        return load_pretrained(path, dtype=torch.float32, device=device), None
    plain = load_pretrained(path, dtype=torch.float32, device=device) if plain_copy else None
    cfg, _ = load_config(path)
    model = apply_fsdp(meta_model(cfg), mp=True, param_dtype=FSDP_PARAM_DTYPES[fsdp_param_dtype],
                       activation_checkpointing=activation_checkpointing)
    model.to_empty(device=device)
    load_full_state_dict_broadcast(model, path if dist.get_rank() == 0 else None)
    return model, plain


def sync_engine(model: Transformer, engine, plain: Transformer | None) -> None:
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


def global_max(x: float) -> float:
    """The largest value of a float over ranks (the value itself without a process group)."""
    if not is_distributed():
        return x
    t = torch.tensor(x, dtype=torch.float64, device=_wire_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def global_mean(parts: list[tuple[dict, float]], maxima: tuple[str, ...] = ()) -> dict:
    """Per key, Σ value·weight / Σ weight over this rank's parts and then over all ranks; the keys in `maxima`
    (largest-value metrics) take the largest value instead.

    parts: (metrics, weight) pairs with the same keys everywhere. A None value stays None (e.g. kl_full when not
    computed); a part of weight 0 is skipped (its NaN means "no tokens"); no weight at all gives NaN.
    One part in one process is returned unchanged, so the one-process loop logs its numbers as they are.
    """
    keys = list(parts[0][0])
    if len(parts) == 1 and not is_distributed():
        return dict(parts[0][0])
    acc = torch.zeros(2, len(keys), dtype=torch.float64)
    top = torch.full((len(keys),), -math.inf, dtype=torch.float64)
    for metrics, w in parts:
        for i, k in enumerate(keys):
            if metrics[k] is not None and w > 0:
                acc[0, i] += float(metrics[k]) * w
                acc[1, i] += w
                if k in maxima:
                    top[i] = torch.maximum(top[i], torch.tensor(float(metrics[k]), dtype=torch.float64))  # NaN stays
    if is_distributed():
        acc = all_reduce_sum(acc.to(_wire_device())).cpu()
        if maxima:  # one more collective only where a caller asks for maxima (the same on every rank)
            top = top.to(_wire_device())
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
            top = top.cpu()
    return {k: None if parts[0][0][k] is None else math.nan if acc[1, i] == 0 else
            top[i].item() if k in maxima else (acc[0, i] / acc[1, i]).item() for i, k in enumerate(keys)}


def _wire_device() -> torch.device:
    """NCCL reduces CUDA tensors only; gloo takes CPU tensors."""
    backend = dist.get_backend()
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def save_hf_checkpoint(model: Transformer, path: str, *, dtype: torch.dtype | None) -> None:
    """Gather the full weights (every rank must call this) and write them on rank 0 in HF layout, atomically.
    `dtype`: cast while writing (None keeps fp32). Weights only: no optimizer, no RNG."""
    sd = gather_full_state_dict(model, rank0_only=True)
    if is_distributed() and dist.get_rank() != 0:
        return
    atomic_write(path, lambda tmp: save_pretrained(model, tmp, state_dict=sd, dtype=dtype))
