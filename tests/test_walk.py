"""What this proves: walk:T is what r3/tasks/tasks.py says: a fixed strongly connected, aperiodic graph of out-degree 4
on the 64 symbols, every (s, e) joined by walks of every length T >= WALK_MIN_T, warm-up answers that are right and
drawn uniformly among all right walks, and a reward that credits each right step of the response's own walk (the last
must end on e) and the EOS slot."""
import collections
import math

import pytest
import torch

from r3.errors import InputError
from r3.tasks.tasks import EOS, SYMBOL0, SYMBOLS, WALK_GRAPH, WALK_MIN_T, _walk_counts, make_task


def test_the_graph_has_out_degree_4_and_every_pair_is_joined_at_every_length_from_the_minimum():
    assert len(WALK_GRAPH) == SYMBOLS and all(len(set(v)) == 4 and 0 <= min(v) and max(v) < SYMBOLS
                                              for v in WALK_GRAPH)
    for T in (WALK_MIN_T, WALK_MIN_T + 1, 64):
        assert all(torch.isfinite(_walk_counts(e, T)[T]).all() for e in range(SYMBOLS)), T
    assert not all(torch.isfinite(_walk_counts(e, 2)[2]).all() for e in range(SYMBOLS))  # not every pair at 2


def test_warmup_answers_are_right_and_uniform_among_the_right_walks():
    task = make_task("walk:8")
    g = torch.Generator().manual_seed(0)
    s, e = 3, 5
    n_right = round(math.exp(_walk_counts(e, 8)[8][s]))
    draws = collections.Counter(tuple(task.answer(s, e, g)) for _ in range(20 * n_right))
    assert len(draws) == n_right  # every right walk turns up
    counts = list(draws.values())  # 20 expected each: a chi-square far below its 99.9 % point for n - 1 dof
    chi2 = sum((c - 20) ** 2 / 20 for c in counts)
    assert chi2 < n_right + 5 * math.sqrt(2 * n_right), chi2
    for ex in task.sample(50, g, split="train"):
        assert len(ex.answer) == 8 and ex.answer[-1] == ex.prompt[1]
        assert task.reward(ex.answer + [EOS], ex) == (1.0, dict(exact=True))


def test_reward_credits_each_right_step_of_the_responses_own_walk():
    task = make_task("walk:8")
    ex = task.sample(1, torch.Generator().manual_seed(1))[0]
    right = ex.answer + [EOS]
    assert task.reward(right, ex)[0] == 1.0
    bad_end = list(right)
    bad_end[7] = SYMBOL0 + next(v for v in WALK_GRAPH[right[6] - SYMBOL0] if SYMBOL0 + v != ex.prompt[1]) \
        if any(SYMBOL0 + v != ex.prompt[1] for v in WALK_GRAPH[right[6] - SYMBOL0]) else EOS
    r, info = task.reward(bad_end, ex)
    assert r == 8 / 9 and not info["exact"]  # a valid step that does not end on e
    detour = list(right)
    detour[2] = SYMBOL0 + next(v for v in range(SYMBOLS) if v not in WALK_GRAPH[right[1] - SYMBOL0])
    r, _ = task.reward(detour, ex)
    assert r <= 7 / 9  # the wrong step, and the next one unless it happens to continue from the detour
    assert task.reward(right[:-1], ex)[0] == 8 / 9  # no EOS
    assert task.reward(right + [EOS], ex)[0] == 9 / 10  # one token too many


def test_exact_reward_pays_only_a_right_walk_and_never_a_loop():
    """walk:T:exact: 1 for a right walk, 0 for anything else; the self-loop answer the per-position credit paid
    62 / 65 in the regime study's walk demo (one looping symbol repeated, no EOS) earns nothing."""
    partial, exact = make_task("walk:8"), make_task("walk:8:exact")
    ex = exact.sample(1, torch.Generator().manual_seed(1))[0]
    right = ex.answer + [EOS]
    assert exact.reward(right, ex) == (1.0, dict(exact=True)) == partial.reward(right, ex)
    loop = next(u for u in range(SYMBOLS) if u in WALK_GRAPH[u])
    looped = [SYMBOL0 + loop] * 9
    assert partial.reward(looped, ex)[0] >= 6 / 9 and exact.reward(looped, ex) == (0.0, dict(exact=False))
    assert exact.reward(right[:-1], ex) == (0.0, dict(exact=False))
    assert [a.answer for a in exact.sample(5, torch.Generator().manual_seed(2))] == \
        [a.answer for a in partial.sample(5, torch.Generator().manual_seed(2))]  # the same walks to learn from


@pytest.mark.parametrize("spec", ["walk:3", "walk:x", "walk:-4", "walk:64:partial", "walk::exact"])
def test_bad_walk_lengths_are_refused(spec):
    with pytest.raises(InputError, match="walk:T with T >="):
        make_task(spec)
