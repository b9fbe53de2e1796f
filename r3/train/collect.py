"""Collect a step's data: prompts → engine samples with routes → rewards → group advantages.

The first phase of a training step (train.py), and the whole of `rollout.py`. The trainer only ever sees a
`Rollout`: the engine's `Batch` (tokens, masks, routes, engine log-probs, rewards) plus the GRPO advantages. Where
the batch came from (the in-process engine, a folder on disk, a remote server) ends here.

Data shards (`train.py --shards S`): each step's prompts are drawn from one data generator that every rank holds in
the same state, then cut into S equal shards. Shard s is sampled with its own generator (`shard_generator_name`)
and belongs to rank s mod world_size, so the same S gives the same data and samples at any world size. With S = 1
the step is the plain one-process loop.
"""
from dataclasses import dataclass

import torch

from r3.rollout.batch import Batch
from r3.rollout.engine import Engine
from r3.train.grpo import group_advantages
from r3.model.model import Transformer
from r3.tasks.tasks import EOS, PAD, Example, Task


@dataclass
class Rollout:
    """One data shard of a step, as the trainer uses it."""
    batch: Batch           # tokens, masks, routes [B, T-1, L, K], engine log-probs, rewards
    adv: torch.Tensor      # [B] group advantages
    adv_metrics: dict      # reward/group_std, ...
    exact: float | None    # fraction of exactly right answers (None for rollouts read from disk)


def reward_batch(task: Task, batch: Batch, examples: list[Example]) -> float:
    """Fill `batch.rewards` from each row's response (row i answers `examples[batch.group[i]]`); returns the
    fraction of exactly right answers."""
    exact = 0
    for i in range(len(batch)):
        reward, info = task.reward(batch.tokens[i][batch.response_mask[i]].tolist(), examples[int(batch.group[i])])
        batch.rewards[i] = reward
        exact += info["exact"]
    return exact / len(batch)


def advantages(batch: Batch, exact: float | None, *, loss: str) -> Rollout:
    """Group-normalised advantages (Dr. GRPO: centred only) around a rewarded batch."""
    adv, adv_metrics = group_advantages(batch.rewards, batch.group, normalize_std=loss != "dr_grpo")
    return Rollout(batch, adv, adv_metrics, exact)


def sample_shard(engine, task, examples: list[Example], *, shard: int, num_shards: int,
                 generator: torch.Generator, group_size: int, temperature: float, top_p: float,
                 max_new_tokens: int, eos_ids: tuple[int, ...], pad_id: int, keep_logp_V: bool) -> tuple[Batch, float]:
    """Shard `shard` of the step's prompts, sampled by `engine` and rewarded. Returns (batch, exact fraction)."""
    per = len(examples) // num_shards
    ex = examples[shard * per:(shard + 1) * per]
    batch = engine.generate([e.prompt for e in ex], max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id,
                            group_size=group_size, temperature=temperature, top_p=top_p, generator=generator,
                            keep_logp_V=keep_logp_V)
    return batch, reward_batch(task, batch, ex)


def shard_rows(batch: Batch, shard: int, num_shards: int) -> Batch:
    """Shard `shard` of a batch read from disk: an equal run of rows, whole GRPO groups only (checked at load by
    `check_shardable`). One shard is the batch itself."""
    if num_shards == 1:
        return batch
    per = len(batch) // num_shards
    return batch.select(torch.arange(shard * per, (shard + 1) * per))


def check_shardable(batch: Batch, num_shards: int, where: str) -> None:
    """Refuse a batch whose rows do not cut into `num_shards` equal runs of whole groups."""
    B = len(batch)
    per = B // num_shards
    groups = [set(batch.group[i * per:(i + 1) * per].tolist()) for i in range(num_shards)]
    if B % num_shards or any(a & b for i, a in enumerate(groups) for b in groups[i + 1:]):
        raise ValueError(f"{where}: {B} rows do not cut into {num_shards} shards of whole GRPO groups (groups of "
                         f"group ids {batch.group.unique().tolist()[:8]}...); use a --shards that divides the "
                         f"number of prompts")


def shard_generator_name(shard: int) -> str:
    """Shard 0 samples with the one-process loop's `sample` generator, so --shards 1 is that loop unchanged."""
    return "sample" if shard == 0 else f"sample{shard}"


def shard_seed(seed: int, shard: int) -> int:
    return seed + 1 + 1_000_003 * shard


def my_shards(num_shards: int, rank: int, world: int) -> list[int]:
    if num_shards % world:
        raise ValueError(f"--shards {num_shards} is not a multiple of the world size {world}: every rank needs "
                         f"the same number of shards (FSDP forwards are collective)")
    return list(range(rank, num_shards, world))


@torch.no_grad()
def rollout(model: Transformer, task: Task, *, num_prompts: int, group_size: int, dtype: str, seed: int,
            temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int | None = None,
            keep_logp_V: bool = False, router_levels: int | None = None,
            engine: Engine | None = None) -> tuple[Batch, list[Example]]:
    """Sample prompts from `task` (seeded), generate at rollout precision `dtype`, fill `rewards` and meta.
    `engine`: sample with this engine as it is (e.g. a lagged one restored from a checkpoint) instead of a fresh
    Engine(model, dtype, router_levels).

    One generator, seeded once, draws the prompts and then the samples: same seed, same batch, bit for bit.
    """
    g = torch.Generator().manual_seed(seed)
    examples = task.sample(num_prompts, g)
    engine = engine if engine is not None else Engine(model, dtype, router_levels=router_levels)
    batch = engine.generate(
        [e.prompt for e in examples], max_new_tokens=max_new_tokens or task.max_new_tokens, eos_ids=(EOS,),
        pad_id=PAD, group_size=group_size, temperature=temperature, top_p=top_p, generator=g,
        keep_logp_V=keep_logp_V)
    exact = reward_batch(task, batch, examples)
    batch.meta.update(task=task.name, seed=seed, exact_frac=exact)
    return batch, examples
