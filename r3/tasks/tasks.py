"""Toy tasks a tiny model learns by RL after a short supervised warm-up. Rewards return (reward, info).

One shared 16-token vocabulary:  0-9 digits | + | = | SORT | REV | <eos> | <pad>   (ids 0-15)
  sort     SORT d1 .. dn =   →  the digits in ascending order, <eos>
  reverse  REV  d1 .. dn =   →  the digits reversed, <eos>
  add      a1..am + b1..bm = →  the digits of a + b, <eos>
and 64 more symbols s0 .. s63 (ids 16-79) for the tasks that need a vocabulary with a tail:
  cipher   x1 .. xn =        →  PI(x1) .. PI(xn), <eos>   (PI: one fixed permutation; default n = 32)
  chain    s =               →  PI(s), PI(PI(s)), ... (T symbols), <eos>   (chain:T, default T = 256)
  walk     s e =             →  any walk s → a1 → ... → aT = e on a fixed graph (out-degree 4), <eos>   (walk:T;
                                walk:T:exact rewards only a right walk)
A task's `vocab_size` is the vocabulary its model needs (`r3.train.warmup.preset_config` widens a preset to it).

The cipher task is the headline setting's (README, "The headline"): after 80 supervised warm-up steps the toy
samples 0 % exact answers, and RL lifts held-out accuracy to 0.46-0.97 within 400 steps on the init seeds whose
warm-up found the position-to-position copy, while its entropy falls from 3 to 0.1 nats per token. The sort task, on
the same toy, stays below 50 % after 1000 steps.

The reward is dense: the fraction of answer positions the response gets right (a response that is too long or too
short is scored against the longer of the two), so GRPO groups have variance from the start. `info["exact"]` says
whether the whole answer, EOS included, was right.

The chain task is the long-response one (experiments/length/): a two-token prompt and an answer as long as asked,
each answer token a function of the one before it (the cipher's 64-entry table). Its reward scores every position
against PI of the token the response itself put before it (the EOS slot against EOS), so one slip costs one
position rather than the rest of the answer. With 64 start symbols its held-out split holds 3 prompts.

The walk task was built to keep entropy: many answers are right (at most 4 successors per symbol, and from a few
steps before the end only those that can still reach e in time), so a policy that solves it need not become
deterministic, unlike the one-answer cipher, whose mismatch vanishes as its entropy does. Measured, it does not keep
it (results/regime/regime.md, the walk demo): under GRPO with the oracle engine, walk:64's reward climbs to 0.96 on
the per-position credit below while no held-out walk ends on e, and its entropy falls to ~1e-3 nats per token, below
the cipher's. The demo's sampled responses say how: by step 100 both seeds answer every prompt with one symbol
repeated to the length cap, a symbol with an edge to itself (WALK_GRAPH has three: s10, s12, s59), never reaching e
and never stopping, so only the first step, the last and the EOS slot miss (62 or 63 of 65 positions credited);
walk:T:exact's all-or-nothing reward pays no loop (it learns slowly at T = 16 and not at T = 64, docs/regime.md).
Its reward counts a position right when its symbol is a successor of the one the response put before it (the last
one must also be e), and the EOS slot; the warm-up's reference answers are walks drawn uniformly among the right
ones (`Walk.answer`). The graph (WALK_GRAPH) is fixed, strongly connected and aperiodic, so every (s, e) has right
answers for any T >= WALK_MIN_T.

Held-out split: `prompt_split(prompt)` puts about one prompt in EVAL_MOD in "eval", by a hash of its content, so the
split is the same on every machine, seed and run. `sample(n, g, split="train")` never returns an eval prompt (it
redraws); `split=None` (the default) draws from all prompts, the stream every earlier run used, bit for bit.

Tasks sit at the bottom of the import graph: they know token ids and rewards, nothing about models or engines
(`r3/train/collect.py` samples and rewards them).
"""
import functools
import hashlib
import math
from dataclasses import dataclass

import torch

from r3.errors import InputError

BASE_VOCAB = [str(d) for d in range(10)] + ["+", "=", "SORT", "REV", "<eos>", "<pad>"]
SYMBOLS = 64  # the cipher task's alphabet: ids 16..79, after the shared 16 (so EOS and PAD keep their ids)
SYMBOL0 = len(BASE_VOCAB)  # id of s0
VOCAB = BASE_VOCAB + [f"s{i}" for i in range(SYMBOLS)]
TOK = {s: i for i, s in enumerate(VOCAB)}
EOS, PAD = TOK["<eos>"], TOK["<pad>"]
EVAL_MOD = 16  # one prompt in 16 (by content hash) is held out for evaluation
SPLITS = (None, "train", "eval")


def prompt_split(prompt: list[int] | str) -> str:
    """'eval' or 'train': a pure function of the prompt's content (token ids, or text for jsonl tasks)."""
    data = prompt.encode() if isinstance(prompt, str) else ",".join(map(str, prompt)).encode()
    h = int.from_bytes(hashlib.sha256(data).digest()[:8], "big")
    return "eval" if h % EVAL_MOD == 0 else "train"


def check_split(split: str | None) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


@dataclass(frozen=True)
class Example:
    prompt: list[int]
    answer: list[int]  # without EOS


class Task:
    name = "task"
    vocab_size = len(BASE_VOCAB)  # the model's vocabulary must cover ids [0, vocab_size)
    widens_positions = False  # True: a preset is built with room for the longest prompt + answer (chain:T)

    def __init__(self, min_len: int, max_len: int):
        self.min_len, self.max_len = min_len, max_len

    @property
    def max_new_tokens(self) -> int:
        return self.max_answer_len + 1

    def _digits(self, g: torch.Generator) -> list[int]:
        n = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=g))
        return torch.randint(0, 10, (n,), generator=g).tolist()

    def split_of(self, ex: Example) -> str:
        return prompt_split(ex.prompt)

    def check_lengths(self, max_positions: int, max_new_tokens: int | None = None) -> int:
        """Raise ValueError unless the longest prompt plus `max_new_tokens` (default: the task's) fits the model's
        positions, as `Engine.generate` needs; else return the longest prompt's length."""
        N = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        if self.max_prompt_len + N > max_positions:
            raise InputError(f"task {self.name}:{self.min_len}-{self.max_len}: prompts up to {self.max_prompt_len} "
                             f"tokens plus {N} new tokens need {self.max_prompt_len + N} positions; the model has "
                             f"{max_positions}")
        return self.max_prompt_len

    def sample(self, n: int, g: torch.Generator, split: str | None = None) -> list[Example]:
        """n examples; with a split, prompts of the other split are redrawn (error if none turns up in 10^5 draws)."""
        check_split(split)
        out, draws = [], 0
        while len(out) < n:
            ex = self.example(g)
            draws += 1
            if split is None or self.split_of(ex) == split:
                out.append(ex)
            elif draws > 100_000 + 1000 * n:
                raise InputError(f"task {self.name} ({self.min_len}-{self.max_len} digits) has too few {split!r} "
                                 f"prompts: {len(out)} in {draws} draws; use longer inputs")
        return out

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
    max_prompt_len = property(lambda self: self.max_len + 2)

    def example(self, g):
        d = self._digits(g)
        return Example([TOK["SORT"]] + d + [TOK["="]], sorted(d))


class Reverse(Task):
    name = "reverse"
    max_answer_len = property(lambda self: self.max_len)
    max_prompt_len = property(lambda self: self.max_len + 2)

    def example(self, g):
        d = self._digits(g)
        return Example([TOK["REV"]] + d + [TOK["="]], d[::-1])


class Add(Task):
    name = "add"
    max_answer_len = property(lambda self: self.max_len + 1)
    max_prompt_len = property(lambda self: 2 * self.max_len + 2)

    def example(self, g):
        a, b = self._digits(g), self._digits(g)
        s = int("".join(map(str, a))) + int("".join(map(str, b)))
        return Example(a + [TOK["+"]] + b + [TOK["="]], [int(c) for c in str(s)])


class Cipher(Task):
    """A substitution cipher over 64 symbols: each symbol of the prompt maps through one fixed permutation PI.
    Responses as long as the prompt (32 symbols by default), a vocabulary of 80, and a 64-entry table the experts
    must hold: long, learnable, with a real tail of tokens to sample at low probability."""
    name = "cipher"
    vocab_size = len(VOCAB)
    PI = torch.randperm(SYMBOLS, generator=torch.Generator().manual_seed(0)).tolist()
    max_answer_len = property(lambda self: self.max_len)
    max_prompt_len = property(lambda self: self.max_len + 1)

    def example(self, g):
        n = int(torch.randint(self.min_len, self.max_len + 1, (1,), generator=g))
        s = torch.randint(0, SYMBOLS, (n,), generator=g).tolist()
        return Example([SYMBOL0 + i for i in s] + [TOK["="]], [SYMBOL0 + self.PI[i] for i in s])


class Chain(Task):
    """Follow PI (the cipher's permutation) for T steps from a start symbol; see the module docstring."""
    name = "chain"
    vocab_size = len(VOCAB)
    widens_positions = True  # a preset grows its position limit to the answer (r3.train.warmup.preset_config)
    max_prompt_len = 2
    max_answer_len = property(lambda self: self.max_len)

    def example(self, g):
        x = int(torch.randint(0, SYMBOLS, (1,), generator=g))
        return Example([SYMBOL0 + x, TOK["="]], list(_chain(x, self.max_len)))  # a copy: callers may edit it

    def reward(self, response: list[int], ex: Example) -> tuple[float, dict]:
        got, T = list(response), len(ex.answer)
        hits = 0
        for i, tok in enumerate(got[:T + 1]):
            if i == T:
                hits += tok == EOS
                continue
            prev = ex.prompt[0] if i == 0 else got[i - 1] if SYMBOL0 <= got[i - 1] < len(VOCAB) else ex.answer[i - 1]
            hits += tok == SYMBOL0 + Cipher.PI[prev - SYMBOL0]
        return hits / max(T + 1, len(got)), dict(exact=got == ex.answer + [EOS])


@functools.cache
def _chain(x: int, T: int) -> tuple[int, ...]:
    """PI(x), PI(PI(x)), ... (T ids): computed once per start symbol and length. Drawing chain:1024's held-out
    prompts redraws about 10^5 examples (3 of its 64 prompts are held out), which took 95 s built token by token."""
    answer = []
    for _ in range(T):
        x = Cipher.PI[x]
        answer.append(SYMBOL0 + x)
    return tuple(answer)


def _walk_graph(seed: int = 0, degree: int = 4) -> list[list[int]]:
    """Each symbol's `degree` successors, drawn from the seed; the first draw (from `seed` up) that is strongly
    connected and aperiodic (some power of the adjacency matrix is all positive) is the graph."""
    while True:
        g = torch.Generator().manual_seed(seed)
        succ = [sorted(torch.randperm(SYMBOLS, generator=g)[:degree].tolist()) for _ in range(SYMBOLS)]
        adj = torch.zeros(SYMBOLS, SYMBOLS, dtype=torch.float64)
        for u, vs in enumerate(succ):
            adj[u, vs] = 1.0
        reach = torch.linalg.matrix_power(adj, SYMBOLS)
        if bool((reach > 0).all()):
            return succ
        seed += 1


WALK_GRAPH = _walk_graph()
WALK_MIN_T = 8  # every (s, e) is joined by walks of every length >= this on WALK_GRAPH (tested)


@functools.cache
def _walk_counts(target: int, T: int) -> torch.Tensor:
    """log of the number of walks of k steps from each symbol to `target`, k = 0..T: [T + 1, SYMBOLS] float64."""
    logn = torch.full((T + 1, SYMBOLS), -math.inf, dtype=torch.float64)
    logn[0, target] = 0.0
    succ = torch.tensor(WALK_GRAPH)
    for k in range(1, T + 1):
        logn[k] = torch.logsumexp(logn[k - 1][succ], dim=-1)
    return logn


@functools.cache
def _walk_steps(target: int, T: int) -> list:
    """[k][u]: the cumulative probabilities of u's successors as the next step of a uniform right walk with k steps
    left (python lists: read one at a time)."""
    logn, succ = _walk_counts(target, T), torch.tensor(WALK_GRAPH)
    out = [None]
    for k in range(1, T + 1):
        out.append(torch.softmax(logn[k - 1][succ], -1).cumsum(-1).tolist())
    return out


class Walk(Task):
    """Walks of exactly T steps from s to e on WALK_GRAPH; see the module docstring. `exact` (walk:T:exact): the
    reward is 1 for a right walk (EOS included) and 0 otherwise, which no loop earns."""
    name = "walk"
    vocab_size = len(VOCAB)
    widens_positions = True
    max_prompt_len = 3
    max_answer_len = property(lambda self: self.max_len)

    def __init__(self, min_len: int, max_len: int, exact: bool = False):
        super().__init__(min_len, max_len)
        self.exact = exact

    def example(self, g):
        s, e = torch.randint(0, SYMBOLS, (2,), generator=g).tolist()
        return Example([SYMBOL0 + s, SYMBOL0 + e, TOK["="]], self.answer(s, e, g))

    def answer(self, s: int, e: int, g: torch.Generator) -> list[int]:
        """A right answer drawn uniformly among all of them: each step weighs a successor by its walks left to e
        (one uniform draw per step, against the successors' cumulative weights)."""
        T, cum, out, u = self.max_len, _walk_steps(e, self.max_len), [], s
        for k, x in zip(range(T, 0, -1), torch.rand(T, generator=g, dtype=torch.float64).tolist()):
            row = cum[k][u]
            i = next((j for j, c in enumerate(row) if x < c), len(row) - 1)
            u = WALK_GRAPH[u][i]
            out.append(SYMBOL0 + u)
        return out

    def reward(self, response: list[int], ex: Example) -> tuple[float, dict]:
        got, T = list(response), self.max_len
        target, hits, prev = ex.prompt[1], 0, ex.prompt[0]
        for i, tok in enumerate(got[:T + 1]):
            if i == T:
                hits += tok == EOS
                continue
            ok = SYMBOL0 <= tok < len(VOCAB) and SYMBOL0 <= prev < len(VOCAB) and \
                tok - SYMBOL0 in WALK_GRAPH[prev - SYMBOL0] and (i < T - 1 or tok == target)
            hits += ok
            prev = tok
        right = hits == T + 1 and len(got) == T + 1
        if self.exact:
            return float(right), dict(exact=right)
        return hits / max(T + 1, len(got)), dict(exact=right)


TASKS = {"sort": Sort, "reverse": Reverse, "add": Add, "cipher": Cipher, "chain": Chain, "walk": Walk}


def make_task(spec: str) -> Task:
    """'cipher', 'sort', 'reverse', 'add', optionally with a length range: 'sort:6-10', 'cipher:32-32'; 'chain' or
    'chain:T', 'walk', 'walk:T' (the answer length) or 'walk:T:exact' (all-or-nothing reward)."""
    name, _, rng = spec.partition(":")
    if name not in TASKS:
        raise InputError(f"unknown task {name!r}; choose from {sorted(TASKS)} (optionally NAME:MIN-MAX)")
    if name == "chain":
        if rng and not (rng.isdigit() and int(rng) >= 1):
            raise InputError(f"bad answer length in task {spec!r}; expected e.g. 'chain:256'")
        return Chain(1, int(rng) if rng else 256)
    if name == "walk":
        rng, _, credit = rng.partition(":")
        if (rng and not (rng.isdigit() and int(rng) >= WALK_MIN_T)) or credit not in ("", "exact") or \
                (credit and not rng):
            raise InputError(f"bad walk task {spec!r}; expected walk:T with T >= {WALK_MIN_T}, optionally "
                             f"walk:T:exact (reward 1 for a right walk, else 0), e.g. 'walk:64' or 'walk:64:exact'")
        return Walk(1, int(rng) if rng else 64, exact=credit == "exact")
    lo, hi = dict(add=(2, 4), cipher=(32, 32)).get(name, (6, 10))
    if rng:
        try:
            lo, hi = (int(x) for x in rng.split("-"))
        except ValueError:
            raise InputError(f"bad length range in task {spec!r}; expected e.g. '{name}:6-10'") from None
        if not 1 <= lo <= hi:
            raise InputError(f"bad length range in task {spec!r}: need 1 <= MIN <= MAX")
    return TASKS[name](lo, hi)


def decode(ids: list[int]) -> str:
    return " ".join(VOCAB[i] for i in ids)
