"""Memory at scale: a per-GPU plan for FSDP2 training (`train.py --dry-run`).

`memory_plan` counts parameters from the config and adds up, per GPU:
  static     sharded master params + sharded grads + optimizer state (FSDP2 shards all three over world_size)
  transient  what FSDP2 all-gathers: the root group (embeddings, lm_head) and two blocks (current + prefetched)
             in param_dtype, plus one block's unsharded gradient before its reduce-scatter
  activations  an *estimate*: with activation checkpointing, every block's input plus one block's working set;
             without, every block's working set. Attention is assumed fused (no [T, T] scores kept)
  logits     one chunk of `r3.train.score.chunked_logprobs`: vocab_chunk positions × V in fp32, ×3 (logits, probs,
             grad)
The static part is exact arithmetic; the rest is an estimate good to tens of percent. Allocator fragmentation,
CUDA context (~0.5-1 GiB) and NCCL buffers are not counted.
"""
import torch

from r3.model.model import ModelConfig

GiB = 2 ** 30
QWEN3_30B_A3B = ModelConfig(  # Qwen/Qwen3-30B-A3B config.json
    vocab_size=151936, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
    head_dim=128, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
    rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960)
OPTIMIZER_STATES = {"adamw": 2, "sgd": 0}  # fp32 tensors per parameter


def param_counts(cfg: ModelConfig) -> dict:
    """Parameter counts by group, from the config (exactly what `Transformer(cfg)` allocates)."""
    D, V, L, hd = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers, cfg.head_dim
    attn = D * hd * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads) + 2 * hd
    experts = 3 * cfg.num_experts * cfg.moe_intermediate_size * D
    router = cfg.num_experts * D
    block = attn + experts + router + 2 * D
    root = 2 * V * D + D
    active_block = attn + 3 * cfg.num_experts_per_tok * cfg.moe_intermediate_size * D + router + 2 * D
    return dict(total=root + L * block, active=root + L * active_block, block=block, root=root,
                experts=L * experts, attention=L * attn)


def memory_plan(cfg: ModelConfig, world_size: int, *, optimizer: str = "adamw",
                param_dtype: torch.dtype = torch.bfloat16, master_dtype: torch.dtype = torch.float32,
                seq_len: int = 4096, micro_batch: int = 1, vocab_chunk: int = 1024,
                activation_checkpointing: bool = True) -> dict:
    """Bytes per GPU for FSDP2 training of `cfg` over `world_size` GPUs (see the module docstring)."""
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from {sorted(OPTIMIZER_STATES)}")
    n = param_counts(cfg)
    pb, mb = param_dtype.itemsize, master_dtype.itemsize
    params = n["total"] * mb / world_size
    grads = n["total"] * 4 / world_size  # reduce_dtype fp32: FSDP2 keeps sharded grads in the master dtype
    opt = n["total"] * 4 * OPTIMIZER_STATES[optimizer] / world_size
    transient = (n["root"] + 3 * n["block"]) * pb
    BT, D = micro_batch * seq_len, cfg.hidden_size
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    moe = cfg.num_experts_per_tok * (D + 3 * cfg.moe_intermediate_size) + cfg.num_experts * 2  # dispatch + router
    per_block = BT * (2 * qkv + 8 * D + moe) * pb  # saved tensors of one block's forward (rough)
    if activation_checkpointing:
        acts = cfg.num_hidden_layers * BT * D * pb + 2 * per_block
    else:
        acts = cfg.num_hidden_layers * per_block
    logits = 3 * min(vocab_chunk, BT) * cfg.vocab_size * 4
    static = params + grads + opt
    return dict(world_size=world_size, optimizer=optimizer, param_dtype=str(param_dtype).split(".")[-1],
                master_dtype=str(master_dtype).split(".")[-1], seq_len=seq_len, micro_batch=micro_batch,
                vocab_chunk=vocab_chunk, activation_checkpointing=activation_checkpointing,
                n_params=n["total"], n_active=n["active"], params=params, grads=grads, optimizer_state=opt,
                static=static, transient=transient, activations=acts, logits_chunk=logits,
                total=static + transient + acts + logits)


def format_plan(plan: dict) -> str:
    """A small table of `memory_plan` in GiB per GPU."""
    rows = [("parameters (total / active)", f"{plan['n_params'] / 1e9:.2f}B / {plan['n_active'] / 1e9:.2f}B")]
    for key, label in (("params", f"master params ({plan['master_dtype']}, sharded)"),
                       ("grads", "grads (fp32, sharded)"), ("optimizer_state", f"{plan['optimizer']} state (sharded)"),
                       ("static", "= static"), ("transient", f"all-gathered blocks ({plan['param_dtype']})"),
                       ("activations", "activations (estimate" + (", AC)" if plan["activation_checkpointing"]
                                                                   else ", no AC)")),
                       ("logits_chunk", f"logits chunk ({plan['vocab_chunk']} positions)"), ("total", "= total")):
        rows.append((label, f"{plan[key] / GiB:8.2f} GiB"))
    head = (f"memory plan per GPU: world {plan['world_size']}, seq {plan['seq_len']} × micro-batch "
            f"{plan['micro_batch']}")
    width = max(len(r[0]) for r in rows)
    return "\n".join([head] + [f"  {a:<{width}}  {b}" for a, b in rows])
