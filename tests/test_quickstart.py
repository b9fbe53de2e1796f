"""What this proves: experiments.quickstart summarises a run the way the README quotes it (reward means of the first
and last 20 steps, the first and last logged entropy, held-out accuracy after each evaluated step) and refuses a run
too short to summarise. The run itself is remade and checked by `experiments.reproduce --check --quick` in CI."""
import pytest

from experiments.quickstart import WINDOW, summarize
from r3.errors import InputError


def test_summary_of_a_run():
    rows = [dict(step=s, reward=0.0 if s < WINDOW else 1.0 if s >= 60 - WINDOW else 0.5,
                 **({"entropy": 3.0 - s / 100} if s % 10 == 0 else {}),
                 **({"eval/accuracy": s / 100, "eval/accuracy_greedy": 0.9} if s % 25 == 24 else {}))
            for s in range(60)]
    q = summarize(rows)
    assert (q["steps"], q["reward_first"], q["reward_last"]) == (60, 0.0, 1.0)
    assert (q["entropy_first"], q["entropy_last"]) == (3.0, 2.5)
    assert q["heldout"] == [dict(step=25, accuracy=0.24, accuracy_greedy=0.9),
                            dict(step=50, accuracy=0.49, accuracy_greedy=0.9)]


def test_a_short_run_is_refused():
    with pytest.raises(InputError, match="needs at least 40"):
        summarize([dict(step=s, reward=0.0) for s in range(39)])
