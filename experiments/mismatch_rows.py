"""The paper's mismatch rows (dense, MoE, MoE + R3) of one preset and rollout precision, measured with the trainer's
own code: the mismatch study (experiments/mismatch/table.py) tabulates them for one seed, and experiments/claims.py
over eight. Shared, so neither imports the other.

  measure(preset, dtype, models, task, args)   the three rows; `args` has prompts, samples, seed, temperature
  DEFAULTS                                      the table's settings (its command-line defaults)
"""
import torch

from r3.train.collect import rollout
from r3.train.metrics import kl_k3
from r3.train.score import old_policy_pass

DEFAULTS = dict(task="sort", prompts=512, samples=8, temperature=1.0, warmup_steps=200)
PAPER = {  # arXiv 2510.11370, Qwen3-30B-A3B; kl is the k3 estimator
    "dense": dict(kl=0.64e-3),
    "MoE": dict(kl=1.535e-3, router_flip_rate=0.10, token_flip_rate=0.94, flips_per_token=6.0),
    "MoE + R3": dict(kl=0.75e-3),
}
ROWS = ("dense", "MoE", "MoE + R3")
N_CHUNKS = 8


@torch.no_grad()
def row_metrics(model, batch, replay: bool, own_routes) -> tuple[dict, torch.Tensor | None]:
    """The trainer's old-policy pass metrics plus kl's standard error over N_CHUNKS chunks of prompts and, for MoE,
    kl split by whether the trainer's own routing flipped >= 1 layer of the token. Returns (metrics, the trainer's
    own routes)."""
    o = old_policy_pass(model, batch, replay="r3" if replay else "none", temperature=batch.meta["temperature"],
                        own_routes=own_routes)  # one forward per row: the MoE + R3 row reuses the MoE row's routes
    m, own = dict(o.metrics, n_tokens=int(batch.loss_mask.sum())), o.own_routes
    P = int(batch.group.max()) + 1
    n = min(N_CHUNKS, P)
    bounds = torch.linspace(0, P, n + 1).round().long().tolist()
    chunk_masks = [batch.loss_mask & ((batch.group >= lo) & (batch.group < hi))[:, None]
                   for lo, hi in zip(bounds[:-1], bounds[1:])]
    kls = torch.tensor([kl_k3(o.logp, batch.rollout_logp, c) for c in chunk_masks])
    m["kl_se"] = float(kls.std() / n ** 0.5) if n > 1 else float("nan")
    m["kl_flipped"] = m["kl_unflipped"] = None
    if batch.routes is not None:
        flipped_BT = (own.long().sort(-1).values != batch.routes.long().sort(-1).values).any(-1).any(-1)
        m["kl_flipped"] = kl_k3(o.logp, batch.rollout_logp, batch.loss_mask & flipped_BT)
        m["kl_unflipped"] = kl_k3(o.logp, batch.rollout_logp, batch.loss_mask & ~flipped_BT)
    return m, own


def measure(preset: str, dtype: str, models: dict, task, args, batches: dict | None = None) -> list[dict]:
    """The three rows of one precision; `batches`, when given, receives the dense and MoE batches (experiments.claims
    inspects the MoE one)."""
    rows, batches, own = [], {} if batches is None else batches, None
    for kind in ("dense", "moe"):
        batches[kind], _ = rollout(models[kind], task, num_prompts=args.prompts, group_size=args.samples,
                                   dtype=dtype, seed=args.seed, temperature=args.temperature, keep_logp_V=True)
    for name, kind, replay in (("dense", "dense", False), ("MoE", "moe", False), ("MoE + R3", "moe", True)):
        b, model = batches[kind], models[kind]
        m, routes = row_metrics(model, b, replay, own)
        if name == "MoE":
            own = routes  # the MoE + R3 row reports the flips of this normal forward on the same batch
        m.update(reward_mean=float(b.rewards.mean()), exact_frac=b.meta["exact_frac"],
                 response_len_mean=float(b.response_mask.sum(1).float().mean()))
        rows.append(dict(preset=preset, dtype=dtype, row=name, **m))
    return rows
