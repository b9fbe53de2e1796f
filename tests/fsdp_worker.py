"""A few R3 training steps on an HF-layout checkpoint, with FSDP2 when launched by torchrun, plain otherwise.

    python tests/fsdp_worker.py --ckpt CKPT --out OUT                         # 1 process, no FSDP
    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/fsdp_worker.py --ckpt CKPT --out OUT

Each step has `--shards` data shards (prompt sets); rank r rolls out and trains on shards r, r + world, ...
With one process the same shards are gradient-accumulated, so both runs see the same data and (up to float
rounding) the same gradients. The loss is normalised by the *global* response-token count; FSDP averages
gradients over ranks, so each rank scales its loss by world_size to turn that average into the global sum.

Per step: rollout with `Engine` (bf16, routes recorded) → forward with `routes_BTLK=batch.routes` (R3) →
`chunked_logprobs` → policy-gradient loss with group-normalised advantages → `clip_grad_norm` → AdamW →
weight sync to the engine. Rank 0 writes metrics.jsonl, the gathered final weights with `save_pretrained`, and
checks that they load back equal.
"""
import argparse
import json
import os

import torch

from r3.rollout.engine import Engine
from r3.scale.fsdp import (all_reduce_sum, apply_fsdp, clip_grad_norm, gather_full_state_dict,
                           load_full_state_dict_broadcast, meta_model, setup_distributed)
from r3.scale.hf import load_pretrained, save_pretrained
from r3.train.score import chunked_logprobs

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--ckpt", required=True, help="HF-layout checkpoint folder (save_pretrained output)")
p.add_argument("--out", required=True, help="folder for metrics.jsonl and the final checkpoint")
p.add_argument("--steps", type=int, default=3, help="optimizer steps")
p.add_argument("--shards", type=int, default=2, help="data shards per step (must be a multiple of world size)")
p.add_argument("--prompts", type=int, default=2, help="prompts per shard")
p.add_argument("--group", type=int, default=2, help="samples per prompt (GRPO group)")
p.add_argument("--ac", action="store_true", help="activation checkpointing (FSDP runs only)")
args = p.parse_args()

torch.set_num_threads(1)
rank, world, device = setup_distributed()
assert args.shards % world == 0, f"--shards {args.shards} is not a multiple of world size {world}"
plain = load_pretrained(args.ckpt, dtype=torch.float32)  # every rank: the weights the engine copies
cfg = plain.cfg
engine = Engine(plain, "bf16")
if world > 1:
    model = apply_fsdp(meta_model(cfg), mp=True, param_dtype=torch.float32, activation_checkpointing=args.ac)
    model.to_empty(device=device)
    load_full_state_dict_broadcast(model, args.ckpt if rank == 0 else None)
else:
    model = load_pretrained(args.ckpt, dtype=torch.float32)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
EOS, PAD, V = cfg.vocab_size - 2, cfg.vocab_size - 1, cfg.vocab_size - 2
os.makedirs(args.out, exist_ok=True)
log = open(os.path.join(args.out, "metrics.jsonl"), "w") if rank == 0 else None

for step in range(args.steps):
    g = torch.Generator().manual_seed(step)  # the same prompts on every rank; each rank takes its shards
    prompts = [[torch.randint(0, V, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
                for _ in range(args.prompts)] for _ in range(args.shards)]
    batches = []
    for s in range(rank, args.shards, world):
        gen = torch.Generator().manual_seed(1000 * step + s)
        b = engine.generate(prompts[s], max_new_tokens=6, eos_ids=(EOS,), pad_id=PAD, group_size=args.group,
                            generator=gen)
        resp = b.tokens.masked_fill(~b.response_mask, PAD)
        b.rewards = ((resp % 2 == 0) & b.response_mask).sum(1) / b.response_mask.sum(1).clamp(min=1)  # even ids
        batches.append(b)
    n_tokens = all_reduce_sum(torch.tensor(float(sum(b.loss_mask.sum() for b in batches))))
    sums = torch.zeros(4, dtype=torch.float64)  # loss, k3 kl sum, reward sum, rows
    for b in batches:
        mask = b.loss_mask
        r = b.rewards.view(-1, args.group)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1)
        hidden, used = model(b.tokens[:, :-1], valid_BT=b.attn_mask[:, :-1], routes_BTLK=b.routes, return_hidden=True)
        assert torch.equal(used, b.routes.long()), "R3: the training forward must use the rollout's experts"
        logp = chunked_logprobs(hidden, model.lm_head.weight, b.tokens[:, 1:], chunk=8)
        loss = -(adv[:, None] * logp * mask).sum() / n_tokens
        (loss * world).backward()  # FSDP averages grads over ranks; ×world makes it the global sum
        log_r = (logp.detach() - b.rollout_logp).double()
        sums += torch.stack([loss.detach().double(), ((log_r.exp() - 1 - log_r) * mask).sum(),
                             b.rewards.sum().double(), torch.tensor(float(len(b)), dtype=torch.float64)])
    grad_norm = clip_grad_norm(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sums = all_reduce_sum(sums)
    full = gather_full_state_dict(model, rank0_only=False)
    plain.load_state_dict(full)
    engine.sync(plain)
    if rank == 0:
        row = dict(step=step, loss=sums[0].item(), kl=(sums[1] / n_tokens).item(), reward=(sums[2] / sums[3]).item(),
                   grad_norm=grad_norm, tokens=int(n_tokens),
                   sharded=type(next(model.parameters())).__name__ == "DTensor")
        print(" | ".join(f"{k} {v}" for k, v in row.items()), flush=True)
        log.write(json.dumps(row) + "\n")

sd = gather_full_state_dict(model)  # rank 0 only
if rank == 0:
    save_pretrained(plain, os.path.join(args.out, "final"), max_shard_size="20KB", state_dict=sd)
    back = load_pretrained(os.path.join(args.out, "final"), dtype=torch.float32).state_dict()
    assert sd.keys() == back.keys() and all(torch.equal(sd[k], back[k]) for k in sd), "saved weights differ"
    with open(os.path.join(args.out, "roundtrip_ok"), "w") as f:
        f.write("ok\n")
    log.close()
if world > 1:
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
