"""Toy tasks a tiny model learns by RL after a short supervised warm-up. Rewards return (reward, info).

One shared 16-token vocabulary:  0-9 digits | + | = | SORT | REV | <eos> | <pad>
  sort     SORT d1 .. dn =   →  the digits in ascending order, <eos>
  reverse  REV  d1 .. dn =   →  the digits reversed, <eos>
  add      a1..am + b1..bm = →  the digits of a + b, <eos>

The reward is dense: the fraction of answer positions the response gets right (a response that is too long or too
short is scored against the longer of the two), so GRPO groups have variance from the start. `info["exact"]` says
whether the whole answer, EOS included, was right.

Tasks sit at the bottom of the import graph: they know token ids and rewards, nothing about models or engines
(`r3/collect.py` samples and rewards them).
"""
from dataclasses import dataclass

import torch

VOCAB = [str(d) for d in range(10)] + ["+", "=", "SORT", "REV", "<eos>", "<pad>"]
TOK = {s: i for i, s in enumerate(VOCAB)}
EOS, PAD = TOK["<eos>"], TOK["<pad>"]


@dataclass(frozen=True)
class Example:
    prompt: list[int]
    answer: list[int]  # without EOS


class Task:
    name = "task"

    def __init__(self, min_len: int, max_len: int):
        self.min_len, self.max_len = min_len, max_len

    @property
    def max_new_tokens(self) -> int:
        return self.max_answer_len + 1

    def _digits(self, g: torch.Generator) -> list[int]:
        n = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=g))
        return torch.randint(0, 10, (n,), generator=g).tolist()

    def sample(self, n: int, g: torch.Generator) -> list[Example]:
        return [self.example(g) for _ in range(n)]

    def reward(self, response: list[int], ex: Example) -> tuple[float, dict]:
        """response: generated ids, the EOS included if one was produced."""
        target = ex.answer + [EOS]
        got = list(response)
        hits = sum(int(a == b) for a, b in zip(got, target))
        reward = hits / max(len(target), len(got))
        return reward, dict(exact=got == target)


class Sort(Task):
    name = "sort"
    max_answer_len = property(lambda self: self.max_len)

    def example(self, g):
        d = self._digits(g)
        return Example([TOK["SORT"]] + d + [TOK["="]], sorted(d))


class Reverse(Task):
    name = "reverse"
    max_answer_len = property(lambda self: self.max_len)

    def example(self, g):
        d = self._digits(g)
        return Example([TOK["REV"]] + d + [TOK["="]], d[::-1])


class Add(Task):
    name = "add"
    max_answer_len = property(lambda self: self.max_len + 1)

    def example(self, g):
        a, b = self._digits(g), self._digits(g)
        s = int("".join(map(str, a))) + int("".join(map(str, b)))
        return Example(a + [TOK["+"]] + b + [TOK["="]], [int(c) for c in str(s)])


TASKS = {"sort": Sort, "reverse": Reverse, "add": Add}


def make_task(spec: str) -> Task:
    """'sort', 'reverse', 'add', optionally with a length range: 'sort:6-10'."""
    name, _, rng = spec.partition(":")
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)} (optionally NAME:MIN-MAX)")
    lo, hi = (6, 10) if name != "add" else (2, 4)
    if rng:
        try:
            lo, hi = (int(x) for x in rng.split("-"))
        except ValueError:
            raise ValueError(f"bad length range in task {spec!r}; expected e.g. '{name}:6-10'") from None
        if not 1 <= lo <= hi:
            raise ValueError(f"bad length range in task {spec!r}: need 1 <= MIN <= MAX")
    return TASKS[name](lo, hi)


def decode(ids: list[int]) -> str:
    return " ".join(VOCAB[i] for i in ids)
