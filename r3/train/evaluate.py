"""Held-out evaluation: greedy and sampled accuracy on a fixed prompt set that training never draws.

  heldout_examples(task, n, seed)   n distinct prompts of the task's "eval" split (`r3.tasks.tasks.prompt_split`, a hash
                                    of the prompt's content); training draws with `task.sample(..., split="train")`,
                                    so the two never share a prompt. A separate `eval_task` (e.g. a jsonl eval file)
                                    gives all its rows instead, less any whose question is also in a jsonl `task`.
  evaluate(engine, task, examples)  one greedy response and `samples` sampled responses per prompt, scored with
                                    `reward_batch`, the function that scores training rollouts:
      eval/accuracy_greedy   fraction of prompts whose greedy answer is exactly right
      eval/accuracy          fraction of sampled responses that are exactly right (mean over samples and prompts)
      eval/reward            mean task reward of the sampled responses (eval/reward_greedy: of the greedy ones)
      eval/response_length   mean sampled response length (tokens, EOS included)
      eval/n                 number of prompts

It evaluates the policy as the rollout engine serves it (pass the trainer's `Engine`, synced); a bare model is
wrapped in an fp32 engine (a copy of its weights). Left out: sharding the evaluation over ranks under torchrun (one
process evaluates every prompt) and pass@k.
"""
import torch

from r3.rollout.engine import Engine
from r3.train.collect import reward_batch


def heldout_examples(task, n: int, seed: int = 0, *, eval_task=None) -> list:
    """A fixed, seeded list of up to n distinct held-out examples (fewer only when the split has fewer)."""
    g = torch.Generator().manual_seed(seed)
    if eval_task is not None and hasattr(eval_task, "rows"):  # a separate jsonl file: all of it, less overlaps
        seen = {q for q, _ in getattr(task, "rows", [])}
        rows = [i for i, (q, _) in enumerate(eval_task.rows) if q not in seen]
        return _pick(eval_task, rows, n, g)
    source = eval_task or task
    if hasattr(source, "rows"):  # jsonl, one file: its eval split
        return _pick(source, source.split_rows("eval"), n, g)
    out, seen = [], set()
    for _ in range(100 * n + 10_000):  # toy: draw until n distinct eval prompts
        ex = source.sample(1, g, split="eval")[0]
        if tuple(ex.prompt) not in seen:
            seen.add(tuple(ex.prompt))
            out.append(ex)
            if len(out) == n:
                break
    return out


def _pick(task, rows: list[int], n: int, g: torch.Generator) -> list:
    if not rows:
        raise ValueError(f"{getattr(task, 'path', task)}: no held-out rows")
    return [task.example(rows[i]) for i in torch.randperm(len(rows), generator=g)[:n].tolist()]


@torch.no_grad()
def evaluate(engine_or_model, task, examples: list, *, max_new_tokens: int, eos_ids: tuple[int, ...], pad_id: int,
             samples: int = 4, temperature: float = 1.0, top_p: float = 1.0, generator: torch.Generator | None = None,
             prompts_per_batch: int | None = None) -> dict:
    """Greedy and sampled accuracy of the engine's policy on `examples` (see the module docstring for the keys).

    samples=0 skips the sampled responses (their keys are then None). `generator` draws the samples; None: a fresh
    one seeded 0 on the engine's device, so two calls (or two arms) with the same weights sample the same.
    """
    if not examples:
        raise ValueError("evaluate needs at least one example")
    engine = engine_or_model if hasattr(engine_or_model, "generate") else Engine(engine_or_model, "fp32")
    if generator is None:  # a server engine (r3.rollout.remote) has no local weights: its seeds are drawn on the CPU
        model = getattr(engine, "model", None)
        generator = torch.Generator(device=next(model.parameters()).device if model is not None else "cpu")
        generator.manual_seed(0)
    per = prompts_per_batch or len(examples)
    sums = dict(exact_g=0.0, reward_g=0.0, exact=0.0, reward=0.0, length=0.0, rows=0)
    gen = dict(max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id, generator=generator)
    for s in range(0, len(examples), per):
        chunk = examples[s:s + per]
        prompts = [e.prompt for e in chunk]
        b = engine.generate(prompts, group_size=1, temperature=0.0, **gen)
        sums["exact_g"] += reward_batch(task, b, chunk) * len(b)
        sums["reward_g"] += float(b.rewards.sum())
        if samples:
            b = engine.generate(prompts, group_size=samples, temperature=temperature, top_p=top_p, **gen)
            sums["exact"] += reward_batch(task, b, chunk) * len(b)
            sums["reward"] += float(b.rewards.sum())
            sums["length"] += float(b.response_mask.sum())
            sums["rows"] += len(b)
    n, rows = len(examples), sums["rows"]
    return {"eval/accuracy_greedy": sums["exact_g"] / n, "eval/reward_greedy": sums["reward_g"] / n,
            "eval/accuracy": sums["exact"] / rows if rows else None,
            "eval/reward": sums["reward"] / rows if rows else None,
            "eval/response_length": sums["length"] / rows if rows else None, "eval/n": n}
