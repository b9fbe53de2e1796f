"""What this proves: experiments.staleness.plateaus finds the symbols a cipher run maps wrong on (nearly) every
occurrence, in at least two of its dumps' prompts, and only those; a right answer (a real Cipher example) counts as
exact; the cap is the share of the run's held-out prompts free of the stuck symbols; the inputs it keeps for a grid give
the same table as the run folders, byte for byte on a rerun, and the grid keeps a cipher run's input as the run
finishes; bad input is refused with a line naming the file."""
import gzip
import json
import os

import pytest
import torch

from experiments.staleness import plateaus as P
from r3.rollout.batch import Batch, save_batch
from r3.errors import InputError
from r3.train.evaluate import heldout_examples
from r3.tasks.tasks import EOS, SYMBOL0, TOK, Cipher, make_task

N = 4  # symbols per prompt
TASK = f"cipher:{N}-{N}"


def row(symbols, wrong=()):
    """Prompt (symbols, '=') then the answer and EOS, with the symbols in `wrong` mapped one past their image."""
    return [SYMBOL0 + s for s in symbols] + [TOK["="]] + \
        [SYMBOL0 + (Cipher.PI[s] + (s in wrong)) % 64 for s in symbols] + [EOS]


def dump(folder, rows):
    tokens = torch.tensor(rows)
    B, T = tokens.shape
    b = Batch(tokens=tokens, attn_mask=torch.ones(B, T, dtype=torch.bool),
              response_mask=torch.arange(T).expand(B, T) >= N + 1, rollout_logp=torch.zeros(B, T - 1), routes=None,
              rewards=torch.zeros(B), group=torch.zeros(B, dtype=torch.long), meta=dict(prompt_len=N + 1))
    save_batch(b, folder)


# each dump is one prompt's group of 4 samples: symbol 7 is wrong in every one of its 12 occurrences, in 2 prompts;
# symbol 9 is wrong in 1 of its 16; symbol 5 is wrong in all of its 8, but in one prompt only
GROUPS = [[row([7, 9, 3, 7], wrong=(7,))] * 4, [row([7, 9, 9, 3], wrong=(7,))] * 4,
          [row([9, 3, 3, 3], wrong=(9,))] + [row([9, 3, 3, 3])] * 3, [row([5, 3, 5, 3], wrong=(5,))] * 4]


def make_run(path, task=TASK, heldout=(0.2, 0.6, 0.5), groups=GROUPS):
    os.makedirs(path)
    with open(os.path.join(path, "args.json"), "w") as f:
        json.dump(dict(task=task, eval_prompts=16), f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for i, a in enumerate(heldout):
            f.write(json.dumps({"step": i, "eval/accuracy": a}) + "\n")
    with open(os.path.join(path, "done.json"), "w") as f:
        json.dump({}, f)
    for step, rows in enumerate(groups):
        dump(os.path.join(path, "samples", f"step{step * 50}"), rows)


def test_a_right_answer_counts_as_exact():
    task = make_task(TASK)
    ex = task.sample(3, torch.Generator().manual_seed(0))
    rows = [e.prompt + e.answer + [EOS] for e in ex]
    seen, wrong, exact, n = P.symbol_errors(rows, len(ex[0].prompt))
    assert (exact, n, sum(wrong.values()), sum(seen.values())) == (3, 3, 0, 3 * N)
    rows[0][-1] = TOK["<pad>"]  # no EOS after the answer: not exact, though every symbol is right
    assert P.symbol_errors(rows, len(ex[0].prompt))[2] == 2


def test_finds_the_stuck_symbol_and_only_it(tmp_path):
    make_run(tmp_path / "run")
    r = P.read_run(str(tmp_path / "run"), last=8)
    assert r["stuck"] == [7] and r["stuck_prompts"] == [2]  # 5: wrong every time, but in one prompt only
    assert r["cap_expected"] == pytest.approx((63 / 64) ** N)
    free = [not {t - SYMBOL0 for t in e.prompt} & {7} for e in heldout_examples(make_task(TASK), 16)]
    assert r["cap"] == pytest.approx(sum(free) / 16) and r["cap"] < 1
    assert r["rows"] == 16 and r["exact_rows"] == pytest.approx(3 / 16)  # the 3 right rows of the third group
    assert r["other_errors"] == 1 + 8  # symbol 9's one slip, symbol 5's one prompt
    assert (r["best_heldout"], r["last_heldout"]) == (0.6, 0.5)
    assert P.read_run(str(tmp_path / "run"), last=1)["stuck"] == []  # the last dump alone: one prompt


def test_the_share_wrong_must_reach_stuck(tmp_path):
    # symbol 7: 9 of 10 occurrences wrong (0.9: stuck); symbol 8: 8 of 10 (below)
    groups = [[row([7, 8, 3, 3], wrong=(7, 8))] * 5, [row([7, 8, 3, 3], wrong=(7,))] * 4 +
              [row([7, 8, 3, 3], wrong=(8,))]]
    make_run(tmp_path / "run", groups=groups)
    assert P.read_run(str(tmp_path / "run"), last=8)["stuck"] == [7]


def test_grid_inputs_give_the_run_folders_table(tmp_path):
    grid = tmp_path / "grid"
    make_run(grid / "runs" / "a-s0")
    make_run(grid / "runs" / "b-s0.clear")  # a run folder another process's clear() has set aside: not a run
    assert P.save_inputs(str(grid), last=8) == ["a-s0"]
    assert P.save_inputs(str(grid), last=8) == []  # kept, not rewritten
    first = (grid / "dumps" / "a-s0.json.gz").read_bytes()
    os.remove(grid / "dumps" / "a-s0.json.gz")
    P.save_inputs(str(grid), last=8)
    assert (grid / "dumps" / "a-s0.json.gz").read_bytes() == first  # the same run makes the same bytes
    direct = P.read_run(str(grid / "runs" / "a-s0"), last=8)
    (from_inputs,), missing = P.read_grid(str(grid))  # no record, no grid.json: no held-out, fall unknown
    assert from_inputs["fell"] is None and missing == []
    assert {k: v for k, v in from_inputs.items() if "heldout" not in k} == \
        {k: v for k, v in direct.items() if "heldout" not in k}
    P.main(["--grid", str(grid)])
    data = json.loads((grid / "plateaus.json").read_text())
    assert data["runs"][0]["stuck"] == [7]
    md = (grid / "plateaus.md").read_text()
    assert "Runs grid.json does not hold, not in the table either: 1." in md
    assert "Stuck in more than one run of a seed: none." in md
    assert P.save_inputs(str(tmp_path / "clean-clone"), last=8) == []  # no run folders: the kept inputs stand


def test_the_grid_keeps_a_cipher_runs_input_as_it_finishes(tmp_path, capsys):
    grid = tmp_path / "grid"
    make_run(grid / "runs" / "c-s0")
    assert P.keep_input(str(grid), str(grid / "runs" / "c-s0")) is True
    assert P.read_grid(str(grid))[0][0]["stuck"] == [7]
    assert P.keep_input(str(grid), str(grid / "runs" / "c-s0")) is False  # kept once, not rewritten
    make_run(grid / "runs" / "sort-s0", task="sort:6-10")  # another task: nothing to keep, nothing said
    assert P.keep_input(str(grid), str(grid / "runs" / "sort-s0")) is False and capsys.readouterr().out == ""
    os.makedirs(grid / "runs" / "bare-s0")  # a cipher run without dumps: a note, and the grid goes on
    (grid / "runs" / "bare-s0" / "args.json").write_text(json.dumps(dict(task=TASK, eval_prompts=16)))
    (grid / "runs" / "bare-s0" / "done.json").write_text("{}")
    assert P.keep_input(str(grid), str(grid / "runs" / "bare-s0")) is False
    assert "bare-s0: plateau input not kept (" in capsys.readouterr().out
    assert sorted(os.listdir(grid / "dumps")) == ["c-s0.json.gz"]


def test_grid_runs_without_kept_inputs_are_named(tmp_path):
    """A run grid.json holds whose folder went before --save-inputs read it is not silently left out."""
    grid = tmp_path / "grid"
    make_run(grid / "runs" / "fp32-none-n4-lr0.0003-s0")
    P.save_inputs(str(grid), last=8)
    run = dict(collapse_step=None, best_heldout=0.6, final_heldout=0.5)
    both = {"0": run, "1": run}  # the aliased cell holds its twin's runs, as in grid.json: named once, under the twin
    (grid / "grid.json").write_text(json.dumps(dict(lr=3e-4, cells={
        "fp32/none/n1": dict(runs={}), "fp32/r2/n1": dict(alias_of="fp32/none/n1", runs=both),
        "fp32/none/n4": dict(runs=both)})))
    res, missing = P.read_grid(str(grid))
    assert [r["run"] for r in res] == ["fp32-none-n4-lr0.0003-s0"] and res[0]["fell"] is False
    assert missing == ["fp32-none-n4-lr0.0003-s1"]
    P.main(["--grid", str(grid)])
    assert json.loads((grid / "plateaus.json").read_text())["without_inputs"] == missing
    assert "whose dumps were not kept (their run folders went before --save-inputs read them), not in the table " \
           "either: 1 (fp32-none-n4-lr0.0003-s1)." in (grid / "plateaus.md").read_text()


def test_refusals(tmp_path):
    make_run(tmp_path / "sort", task="sort:6-10")
    with pytest.raises(InputError, match="this reads cipher runs"):
        P.read_run(str(tmp_path / "sort"), last=8)
    os.makedirs(tmp_path / "empty")
    with open(tmp_path / "empty" / "args.json", "w") as f:
        json.dump(dict(task=TASK, eval_prompts=16), f)
    with pytest.raises(InputError, match="no sample dumps"):
        P.extract(str(tmp_path / "empty"), last=8)
    os.makedirs(tmp_path / "grid" / "dumps")
    with gzip.open(tmp_path / "grid" / "dumps" / "x.json.gz", "wt") as f:
        f.write("{not json")
    with pytest.raises(InputError, match=r"x\.json\.gz: not a readable input"):
        P.read_grid(str(tmp_path / "grid"))
    with pytest.raises(InputError, match="no inputs"):
        P.read_grid(str(tmp_path / "nothing"))
    for bad in ("{bad", json.dumps(dict(cells={"fp32/none/n4": dict(runs={"0": {}})})),  # no lr
                json.dumps(dict(lr=3e-4, cells=[1]))):
        (tmp_path / "grid" / "grid.json").write_text(bad)
        with pytest.raises(InputError, match=r"grid\.json: not a readable experiments\.staleness grid\.json"):
            P.grid_runs(str(tmp_path / "grid"))
