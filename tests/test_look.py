"""What this proves: the look (`python -m experiments.regime --look`) picks its pair and its steps by its stated rules
(the earliest committed fall, only seeds with both arms; the fall's evaluation plus 100, at most 800; 400 without a
fall), reads the committed records with the confirmation's own flags, says "same" for identical rows and names the
first differing step and key otherwise, and prints the pair beside the rate over all finished seeds and draws
look.png, from synthetic records and a fake local run (no train.py); refusals are one line."""
import gzip
import json
import math
import os

import pytest

from experiments.regime import confirm, look
from experiments.regime.__main__ import main, parse_args
from experiments.regime.confirm_run import arm_run
from experiments.sweep import read_record, record_path
from r3.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = os.path.join(ROOT, "results", "regime", "records")
# the exploration's lv3-clip/none/n4 (seeds 0-7) fell at 649, 449, -, 799, -, -, 549, -: as seeds 8-15 here


def synthetic(records: str, seeds, arms=("none", "r3"), setting: str = "lv3-clip") -> None:
    """Confirmation records at SETTING made from the exploration's (seed s <- seed s - 8), with this round's flags."""
    os.makedirs(records, exist_ok=True)
    for arm in arms:
        for s in seeds:
            out, flags, steps = arm_run(f"{setting}/{arm}/n4", s, "runs")
            head, rows = read_record(os.path.join(GRID, f"{setting}-{arm}-n4-s{s - 8}.jsonl.gz"))
            head = dict(head, name=os.path.basename(out), flags=[*flags, "--steps", str(steps)])
            with gzip.open(record_path(out, records), "wt") as f:
                f.write("\n".join(json.dumps(x) for x in [head, *rows]) + "\n")


def test_the_committed_records_are_read_with_the_confirmations_flags():
    got = look.committed_runs("lv3-clip", os.path.join(ROOT, "results", "regime", "confirm", "records"))
    assert 8 in got["none"] and 8 in got["r3"]  # the first finished pair (2026-12-07)


def test_the_pair_is_the_earliest_fall_and_only_seeds_with_both_arms_count(tmp_path):
    rec = str(tmp_path / "all")
    synthetic(rec, range(8, 16))
    assert look.default_seed(look.committed_runs("lv3-clip", rec))[0] == 9  # fell at 449, before seed 8's 649
    assert look.choose(look.committed_runs("lv3-clip", rec), "lv3-clip", None, None)[2] == 550
    rec = str(tmp_path / "no-r3-for-9")
    synthetic(rec, [8, 9, 14], arms=("none",))
    synthetic(rec, [8, 14], arms=("r3",))
    assert look.default_seed(look.committed_runs("lv3-clip", rec))[0] == 14  # 549; seed 9 has no R3 twin
    rec = str(tmp_path / "none-fell")
    synthetic(rec, [12, 10])
    seed, why = look.default_seed(look.committed_runs("lv3-clip", rec))
    assert seed == 10 and "no committed no-replay run fell yet" in why
    with pytest.raises(InputError, match="no seed of the confirmation has both arms' records"):
        look.default_seed(look.committed_runs("lv3-clip", str(tmp_path / "empty")))


def test_the_steps_rule():
    assert look.steps_for(None)[0] == look.NO_FALL_STEPS == 400
    assert [look.steps_for(x)[0] for x in (0, 49, 50, 449, 649, 749, 799)] == [150, 150, 200, 550, 750, 800, 800]


def test_the_comparison_says_same_or_names_the_first_difference():
    _, rows = read_record(os.path.join(GRID, "lv3-clip-none-n4-s1.jsonl.gz"))
    rows = rows[:60]
    here = [dict(r, step_time=1.0) for r in rows]  # wall time is not in a record, and not compared
    got = look.compare_rows(rows, here)
    assert got["same"] and got["max_abs_diff"] == 0 and got["steps"] == 60
    here[30] = dict(here[30], kl=here[30]["kl"] + 0.5)
    here[40] = dict(here[40], reward=math.nan)
    got = look.compare_rows(rows, here)
    assert not got["same"] and (got["first"]["step"], got["first"]["key"]) == (30, "kl")
    assert got["max_abs_diff"] == math.inf  # a NaN where a number was
    assert look.compare_rows([dict(step=0, x=math.nan)], [dict(step=0, x=math.nan)])["same"]
    got = look.compare_rows(rows, [dict(r, extra=1) if r["step"] == 2 else r for r in rows])
    assert (got["first"]["step"], got["first"]["key"], got["first"]["committed"]) == (2, "extra", "(absent)")
    assert look.compare_rows(rows, rows[:10])["first"]["key"] == "(rows)"


def fake_run(runs_dir: str, cell: str, seed: int, rows: list[dict], steps: int) -> None:
    """A finished look run folder as run_all leaves it, without train.py."""
    out, flags, _ = arm_run(cell, seed, runs_dir)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sweep_flags.json"), "w") as f:
        json.dump([*flags, "--steps", str(steps)], f)
    with open(os.path.join(out, "done.json"), "w") as f:
        json.dump(dict(steps=steps, stopped_on=None, world_size=1), f)
    with open(os.path.join(out, "provenance.json"), "w") as f:
        json.dump(dict(commit="abc", cpu="a test CPU"), f)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(dict(r, step_time=0.5)) + "\n" for r in rows[:steps])


def test_the_look_prints_the_pair_beside_the_rate_and_draws_it(tmp_path, capsys):
    rec, out = str(tmp_path / "records"), str(tmp_path / "look")
    synthetic(rec, range(8, 16))
    committed = look.committed_runs("lv3-clip", rec)
    for arm in ("none", "r3"):
        fake_run(os.path.join(out, "runs"), f"lv3-clip/{arm}/n4", 9, committed[arm][9][1], 550)
    data = main(["--look", "--records", rec, "--out", out])
    text = capsys.readouterr().out
    assert data["seeds"] == [9] and data["steps"] == 550 and data["same"]
    assert "look at lv3-clip: seed 9, by the rule" in text and "steps: 550, by the rule" in text
    assert "seed 9, no replay: committed fell at step 449 (heldout_drop), and came back by its end " \
           "(within 0.1 of its best before); here fell at step 449 (heldout_drop)" in text
    assert "same as committed: yes" in text
    k = sum(x is not None for x in (649, 449, None, 799, None, None, 549, None))
    assert "over all 8 finished confirmation seeds at lv3-clip" in text and f"no replay fell on {k} of 8" in text
    assert "R3 on 0 of 8" in text and (tmp_path / "look" / "look.png").stat().st_size > 10_000
    assert (tmp_path / "look" / "look.md").exists()
    rows = [dict(r, reward=0.0) if r["step"] == 100 else r for r in committed["r3"][9][1]]
    fake_run(os.path.join(out, "runs"), "lv3-clip/r3/n4", 9, rows, 550)
    data = main(["--look", "--records", rec, "--out", out, "--seeds", "9"])
    text = capsys.readouterr().out
    assert not data["same"] and "same as committed: no" in text
    assert "same as committed, seed 9 r3: no: first at step 100, reward" in text
    with pytest.raises(InputError, match="holds a 550-step look; pass --steps 550 or remove it"):
        main(["--look", "--records", rec, "--out", out, "--seeds", "9", "--steps", "500"])
    with pytest.raises(InputError, match=r"^--seeds 20: no committed record of none and r3 at lv3-clip; seeds with "
                                         r"both: 8 9 10 11 12 13 14 15$"):
        main(["--look", "--records", rec, "--out", out, "--seeds", "20"])


@pytest.mark.parametrize("argv,message", [
    (["--look", "--seeds", "3"], "--seeds 3: the look runs the confirmation's seeds 8-31 only"),
    (["--look", "--steps", "75"], "--steps 75: a multiple of 50 (the evaluation interval) from 50 to 800"),
    (["--look", "--steps", "850"], "--steps 850: a multiple of 50"),
    (["--look", "--confirm"], "--look runs on its own"),
    (["--steps", "100"], "--steps and --setting belong to --look"),
])
def test_refusals_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]
    assert confirm.STEPS == 800
