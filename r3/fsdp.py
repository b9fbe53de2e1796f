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

Left out on purpose: tensor/expert parallelism, HSDP, CPU offload of parameters, and sharded (DCP) checkpoints.
Loading broadcasts from rank 0, so rank 0 needs host memory for the whole model in the checkpoint's dtype
(~61 GB in bf16 for Qwen3-30B-A3B); the other ranks read nothing.
"""
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from r3.hf import load_config, read_state_dict
from r3.model import ModelConfig, Transformer


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

    path_or_state on rank 0: an HF checkpoint folder (read with the strict loader of `r3.hf`) or a full state
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

    Every rank must call it (it all-gathers). Write it with `r3.hf.save_pretrained(model, path, state_dict=sd)`.
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

    With FSDP2 the grads are DTensors sharded over ranks: the per-rank norm is a partial result, so it is
    reduced (`full_tensor`) before the clip coefficient is computed. Plain tensors work the same way.
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    total = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type, error_if_nonfinite=False)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)
