"""What this proves: experiments.plateaus finds the symbols a cipher run maps wrong on (nearly) every occurrence in
its sample dumps, and only those; the cap it reports is (1 - k/64)^n; the inputs it keeps for a grid (tokens of the
last dumps) give the same table as the run folders; bad input is refused with a line naming the file."""
import gzip
import json
import os

import pytest
import torch

from experiments import plateaus as P
from r3.batch import Batch, save_batch
from r3.errors import InputError
from r3.tasks import SYMBOL0, Cipher

N = 4  # symbols per prompt


def row(symbols, wrong=()):
    """Prompt (symbols, '=') then the answer, with the symbols in `wrong` mapped one past their image."""
    prompt = [SYMBOL0 + s for s in symbols] + [SYMBOL0 - 1]  # any non-symbol id stands for '='
    answer = [SYMBOL0 + (Cipher.PI[s] + (s in wrong)) % 64 for s in symbols]
    return prompt + answer


def dump(folder, rows):
    tokens = torch.tensor(rows)
    B, T = tokens.shape
    b = Batch(tokens=tokens, attn_mask=torch.ones(B, T, dtype=torch.bool),
              response_mask=torch.arange(T).expand(B, T) >= N + 1, rollout_logp=torch.zeros(B, T - 1), routes=None,
              rewards=torch.zeros(B), group=torch.zeros(B, dtype=torch.long), meta=dict(prompt_len=N + 1))
    save_batch(b, folder)


def make_run(path, task=f"cipher:{N}-{N}", heldout=(0.2, 0.6, 0.5)):
    os.makedirs(path)
    with open(os.path.join(path, "args.json"), "w") as f:
        json.dump(dict(task=task), f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for i, a in enumerate(heldout):
            f.write(json.dumps({"step": i, "eval/accuracy": a}) + "\n")
    with open(os.path.join(path, "done.json"), "w") as f:
        json.dump({}, f)
    # symbol 7 wrong every time it occurs (12 times); symbol 9 wrong in 1 of its 8; symbol 3 right
    for step, rows in enumerate([[row([7, 9, 3, 7], wrong=(7,))] * 4, [row([7, 9, 9, 3], wrong=(7,))] * 4,
                                 [row([9, 3, 3, 3], wrong=(9,))] + [row([9, 3, 3, 3])] * 3]):
        dump(os.path.join(path, "samples", f"step{step * 50}"), rows)


def test_cap():
    assert P.cap(0, 32) == 1 and P.cap(1, 32) == pytest.approx(0.6041, abs=1e-4)
    assert P.cap(2, 32) == pytest.approx((62 / 64) ** 32)


def test_finds_the_stuck_symbol_and_only_it(tmp_path):
    make_run(tmp_path / "run")
    r = P.read_run(str(tmp_path / "run"), last=8)
    assert r["stuck"] == [7] and r["cap"] == pytest.approx((63 / 64) ** N)
    assert r["rows"] == 12 and r["exact_rows"] == pytest.approx(3 / 12)  # only the 3 right rows of the last dump
    assert r["other_errors"] == 1  # symbol 9's one slip
    assert (r["best_heldout"], r["last_heldout"]) == (0.6, 0.5)
    assert P.read_run(str(tmp_path / "run"), last=1)["stuck"] == []  # the last dump alone: 7 does not occur


def test_grid_inputs_give_the_run_folders_table(tmp_path):
    grid = tmp_path / "grid"
    make_run(grid / "runs" / "a-s0")
    assert P.save_inputs(str(grid), last=8) == ["a-s0"]
    assert P.save_inputs(str(grid), last=8) == []  # kept, not rewritten
    first = (grid / "dumps" / "a-s0.json.gz").read_bytes()
    os.remove(grid / "dumps" / "a-s0.json.gz")
    P.save_inputs(str(grid), last=8)
    assert (grid / "dumps" / "a-s0.json.gz").read_bytes() == first  # the same run makes the same bytes
    direct = P.read_run(str(grid / "runs" / "a-s0"), last=8)
    (from_inputs,) = P.read_grid(str(grid))  # no record: no held-out
    assert {k: v for k, v in from_inputs.items() if "heldout" not in k} == \
        {k: v for k, v in direct.items() if "heldout" not in k}
    P.main(["--grid", str(grid)])
    data = json.loads((grid / "plateaus.json").read_text())
    assert data["runs"][0]["stuck"] == [7]
    assert "Stuck in more than one run of a seed: none." in (grid / "plateaus.md").read_text()


def test_refusals(tmp_path):
    make_run(tmp_path / "sort", task="sort:6-10")
    with pytest.raises(InputError, match="this reads cipher runs"):
        P.read_run(str(tmp_path / "sort"), last=8)
    os.makedirs(tmp_path / "empty")
    with open(tmp_path / "empty" / "args.json", "w") as f:
        json.dump(dict(task="cipher:4-4"), f)
    with pytest.raises(InputError, match="no sample dumps"):
        P.extract(str(tmp_path / "empty"), last=8)
    os.makedirs(tmp_path / "grid" / "dumps")
    with gzip.open(tmp_path / "grid" / "dumps" / "x.json.gz", "wt") as f:
        f.write("{not json")
    with pytest.raises(InputError, match=r"x\.json\.gz: not a readable input"):
        P.read_grid(str(tmp_path / "grid"))
    with pytest.raises(InputError, match="no inputs"):
        P.read_grid(str(tmp_path / "nothing"))
