"""What this proves: the staleness grid's statistics are exact (Fisher's test and the permutation test against hand-
computed values), its pre-registered sustained-collapse rule fires on sustained falls and not on single dips, its
n1fresh controls keep N = 4's samples and optimizer steps (read in blocks that keep a non-finite step), neighbouring
cells differ in one flag, and the grid runs end to end at a tiny size (every cell, aliases, tests, figure, a by-seed
table of how each run ended, the pre-registered pick of the most separating setting; the exploratory prediction
from a seed's start reads only seeds 5-7, once all their N >= 4 runs have finished), refuses to run without a
chosen LR, reports a partial grid as partial, and makes the same tables from its committed run records alone (no run
folders): a record round-trips its run's metrics, is byte- identical when remade, refuses other flags, and a damaged
one is named in one clear error."""
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from experiments import rules, stats
from experiments import sweep as W
from experiments.staleness import analysis as A, design as D, grid as G, report
from experiments.stats import fisher_exact, paired_permutation_test, permutation_test

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)
TINY = ("--task sort:3-4 --warmup-steps 3 --prompts-per-step 4 --group-size 2 --val-every 0 --eval-every 2 "
        "--eval-prompts 2 --old-logp engine --lr 1e-3")


def test_fisher_and_permutation_exact():
    # 5 of 8 vs 0 of 8: P(X=5) = C(8,5) C(8,0) / C(16,5) = 56 / 4368, and the mirror table is as extreme
    assert math.isclose(fisher_exact(5, 8, 0, 8), 2 * 56 / 4368)
    assert fisher_exact(2, 8, 2, 8) == 1.0 and fisher_exact(0, 0, 3, 8) == 1.0
    assert math.isclose(fisher_exact(8, 8, 0, 8), 2 / math.comb(16, 8))
    # [1, 2] vs [3, 4]: of the 6 splits only the observed one and its mirror reach |diff| = 2
    assert math.isclose(permutation_test([1, 2], [3, 4]), 2 / 6)
    assert permutation_test([1, 1, 1], [1, 1, 1]) == 1.0 and permutation_test([], [1.0]) == 1.0
    # two equal values stored 5e-8 apart (7 significant digits of an fp32 number) still tie: swapping them gives a
    # split as extreme as the observed one, so 4 of the 6 splits count, not 2
    assert math.isclose(permutation_test([0.0, 1.0], [1.0 + 5e-8, 2.0]), 4 / 6)
    # paired: 4 positive differences; of the 16 sign flips only all-plus and all-minus reach |mean| = 2.5
    assert math.isclose(paired_permutation_test([1, 2, 3, 4]), 2 / 16)
    assert paired_permutation_test([1, -1, 1, -1]) == 1.0 and paired_permutation_test([]) == 1.0


def row(step, reward=0.5, acc=None, **kw):
    r = dict(dict(step=step, reward=reward, loss=0.0, grad_norm=1.0), **kw)
    if acc is not None:
        r["eval/accuracy"] = acc
    return r


def test_sustained_rule():
    evals = lambda accs: [row(i, acc=a) for i, a in enumerate(accs)]  # noqa: E731
    assert rules.sustained_collapse(evals([0.2, 0.9, 0.5, 0.9, 0.95])) == (None, None)  # one dip, recovered
    assert rules.sustained_collapse(evals([0.2, 0.9, 0.5, 0.55, 0.9])) == (2, "heldout_drop")  # two in a row
    assert rules.sustained_collapse(evals([0.2, 0.9, 0.9, 0.5])) == (3, "heldout_drop")  # at the last evaluation
    high, low = [row(s, 0.9) for s in range(20)], [row(s, 0.1) for s in range(20, 90)]
    assert rules.sustained_collapse(high + low[:40] + [row(s, 0.9) for s in range(60, 90)]) == (None, None)  # < 50
    step, why = rules.sustained_collapse(high + low)
    assert why == "reward_drop" and 20 < step < 30
    assert rules.sustained_collapse([row(0), row(1, grad_norm=float("inf"))]) == (1, "nonfinite")
    assert rules.max_drawdown(evals([0.2, 0.9, 0.5, 0.8])) == 0.9 - 0.5


def test_n1fresh_blocks_keep_a_non_finite_grad_norm_and_a_short_last_block():
    rows = [row(s, reward=0.5, acc=0.5 if s == 3 else None) for s in range(4)]
    rows += [row(4, grad_norm=2.0), row(5, grad_norm=float("nan"))]  # a run stopped at step 5 by a NaN
    b = rules.blocks(rows, 4)
    assert [x["step"] for x in b] == [0, 1] and b[0]["eval/accuracy"] == 0.5 and b[0]["grad_norm"] == 1.0
    assert math.isnan(b[1]["grad_norm"]) and b[1]["reward"] == 0.5  # the mean of the two steps it holds
    assert rules.sustained_collapse(b) == (1, "nonfinite")


def test_relative_rule_sees_falls_the_absolute_one_cannot():
    # a run that peaks at 0.18 (chain:1024's level) and falls to 0.05: 0.13 below its best, under 0.3
    evals = lambda accs: [row(i, acc=a) for i, a in enumerate(accs)]  # noqa: E731
    low = evals([0.10, 0.18, 0.06, 0.05, 0.05])
    assert rules.sustained_collapse(low) == (None, None)
    assert rules.sustained_collapse(low, relative=0.5) == (2, "heldout_drop")
    assert rules.sustained_collapse(evals([0.10, 0.18, 0.08, 0.15]), relative=0.5) == (None, None)  # one dip
    assert rules.sustained_collapse(evals([0.02, 0.08, 0.0, 0.0]), relative=0.5) == (None, None)  # best under the floor
    high, fall = [row(s, 0.2) for s in range(20)], [row(s, 0.05) for s in range(20, 90)]
    assert rules.sustained_collapse(high + fall) == (None, None)
    step, why = rules.sustained_collapse(high + fall, relative=0.5)
    assert why == "reward_drop" and step == 30  # EMA 0.05 + 0.15·0.9^k <= 0.1 from k = 11


def test_cells_and_controls():
    cells = D.grid_cells()
    assert len({D.alias(c) for c in cells}) == 13 + 2 and D.alias("fp32/r2/n1") == "fp32/none/n1"
    out, base, steps = D.cell_run("fp8-router/none/n4", 0, 5e-4, "R")
    for other in ("fp8-router/r3/n4", "fp32/none/n4", "fp8-router/none/n8"):  # one flag apart
        _, flags, _ = D.cell_run(other, 0, 5e-4, "R")
        assert len(flags) == len(base) and sum(a != b for a, b in zip(flags, base)) == 1, other
    _, fresh, fresh_steps = D.cell_run("fp8-router/none/n1fresh", 0, 5e-4, "R")
    val = lambda f, k: float(W.flag_value(f, k, "nan"))  # noqa: E731
    assert fresh_steps == 4 * steps and val(fresh, "--prompts-per-step") * 4 == val(base, "--prompts-per-step")
    n4_updates = steps * val(base, "--mini-steps")
    assert fresh_steps * val(fresh, "--mini-steps") == n4_updates  # the same optimizer steps, the same samples
    for k in ("--eval-every", "--fidelity-every", "--mismatch-every"):
        assert val(fresh, k) == 4 * val(base, k)


def test_outcome_table_names_each_runs_ending():
    run = lambda c, s, best: dict(collapse_step=c, secondary_step=s, best_heldout=best)  # noqa: E731
    cells = {"a/none/n4": dict(runs={0: run(249, 249, 0.99), 1: run(None, 799, 1.0)}),
             "a/r3/n4": dict(runs={"0": run(None, None, 0.5)})}  # grid.json's string keys read the same
    rows = rules.outcome_table(cells, ["a/none/n4", "a/r3/n4"], [0, 1]).splitlines()
    assert rows[-2] == "| a/none/n4 | **fell 249** (0.99) | dip 799 (1) |"
    assert rows[-1] == "| a/r3/n4 | ok (0.5) | · |"  # seed 1 has not finished


def test_cell_table_medians_of_an_even_count_are_the_middle_two_averaged():
    run = lambda dd, gn: dict(max_drawdown=dd, max_grad_norm=gn, collapse_step=None, best_heldout=1.0,  # noqa: E731
                              final_heldout=1.0, mean_kl=0.0, mean_staleness_flips=None, mean_engine_flips=None)
    cells = {"a/none/n4": dict(collapsed=0, secondary_collapsed=0, n=2, alias_of=None,
                               runs={0: run(0.1, 2.0), 1: run(0.3, 4.0)})}
    row = rules.cell_table(cells, ["a/none/n4"]).splitlines()[-1]
    assert "| 0.2 [0.1, 0.3] |" in row and "| 3 |" in row  # not the upper one (0.3, 4)


def test_most_separating_setting_follows_its_rule():
    def t(n, metric, p, effect=0.0, a="fp8-router/none", b="fp8-router/r3"):
        return dict(a=f"{a}/n{n}", b=f"{b}/n{n}", metric=metric, p=p, effect=effect, counts=f"n{n}")
    ts = [t(1, "collapsed", 1.0), t(1, "max_drawdown", 0.5),
          t(4, "collapsed", 0.03, 0.6), t(4, "max_drawdown", 0.2),
          t(8, "collapsed", 0.03, -0.6), t(8, "max_drawdown", 0.1),  # ties on p: the smaller drawdown p wins
          t(4, "collapsed", 0.001, 1.0, b="fp32/none")]  # another pair: never read
    pick = A.most_separating(ts)
    assert (pick["N"], pick["p"], pick["direction"], pick["separates"]) == (8, 0.03, "R3 collapsed more", True)
    ts[5] = t(8, "max_drawdown", 0.2)  # a full tie: the smaller N
    assert A.most_separating(ts)["N"] == 4 and A.most_separating(ts)["direction"] == "no replay collapsed more"
    assert A.most_separating(ts[:2])["separates"] is False and A.most_separating([]) is None


def test_holm_adjusts_in_step_down_order():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # 3*.01; 1*.04 -> max(.06, .04); 2*.03
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0] and stats.holm([]) == []


def test_mechanism_verdict_follows_its_rule():
    def fisher(a, b, ca, cb, n=8):
        return dict(a=a, b=b, metric="collapsed", p=fisher_exact(ca, n, cb, n), effect=(ca - cb) / n,
                    counts=f"{ca}/{n} vs {cb}/{n}")
    null = [fisher(a, b, 2, 2) for a, b in D.PRECISION_TESTS + D.STALENESS_TESTS]
    assert A.mechanism(null, complete=True)["verdict"] == "(c)"
    drawdown = [dict(t, metric="max_drawdown", p=1e-6, effect=0.5) for t in null]  # tests() emits these beside
    assert A.mechanism(null + drawdown, complete=True)["verdict"] == "(c)"  # only the Fisher tests decide
    assert A.mechanism(null, complete=False)["verdict"] is None  # partial: provisional only
    assert A.mechanism(null[:-1], complete=True)["verdict"] is None  # a test missing: no verdict
    i = D.STALENESS_TESTS.index(("fp32/none/n4", "fp32/r2/n4"))
    ts = list(null)
    ts[len(D.PRECISION_TESTS) + i] = fisher(*D.STALENESS_TESTS[i], 6, 0)  # p = 0.007 < 0.05 / 6
    m = A.mechanism(ts, complete=True)
    assert m["verdict"] == "(b)" and m["staleness"]["supported"] and not m["precision"]["supported"]
    assert m["staleness"]["by_replay"]  # a none-vs-r2 test passed: the routing
    j = D.STALENESS_TESTS.index(("fp32/none/n4", "fp32/none/n1fresh"))
    only_fresh = list(null)
    only_fresh[len(D.PRECISION_TESTS) + j] = fisher(*D.STALENESS_TESTS[j], 6, 0)
    m = A.mechanism(only_fresh, complete=True)
    assert m["verdict"] == "(b)" and not m["staleness"]["by_replay"]  # staleness, not shown to be the routing's
    ts[len(D.PRECISION_TESTS) + i] = fisher(*D.STALENESS_TESTS[i], 5, 0)  # p = 0.026: not after Holm over 6
    assert A.mechanism(ts, complete=True)["verdict"] == "(c)"
    ts[len(D.PRECISION_TESTS) + i] = fisher(*D.STALENESS_TESTS[i], 0, 6)  # the other way round: against (b)
    m = A.mechanism(ts, complete=True)
    assert m["verdict"] == "(c)" and m["staleness"]["against"] and not m["precision"]["against"]
    ts[0] = fisher(*D.PRECISION_TESTS[0], 7, 0)
    assert A.mechanism(ts, complete=True)["verdict"] == "(a)"
    ts[len(D.PRECISION_TESTS) + i] = fisher(*D.STALENESS_TESTS[i], 8, 0)
    assert A.mechanism(ts, complete=True)["verdict"] == "(a) and (b)"
    # every pair the rule reads is one the grid tests, in the same order (a's arm first)
    cells = {c: dict(collapsed=1, n=1, alias_of=None if D.alias(c) == c else D.alias(c),
                     runs={0: dict(max_drawdown=0.1)}) for c in D.grid_cells()}
    tested = {(t["a"], t["b"]) for t in A.tests(cells)}
    assert set(D.PRECISION_TESTS + D.STALENESS_TESTS) <= tested


def test_learning_test_reads_only_the_new_seeds_and_leaves_out_seeds_neither_arm_learned():
    def cell(bests):
        return dict(runs={str(s): dict(best_heldout=b) for s, b in bests.items()})
    r3 = {0: 0.5, 1: 0.6, 2: 0.1, 3: 0.0, 4: 0.40, 5: 0.50, 6: 0.45, 7: 0.55}
    r2 = {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.05, 4: 0.99, 5: 0.97, 6: 0.98, 7: 0.96}
    cells = {"fp8-router/r3/n4": cell(r3), "fp8-router/r2/n4": cell(r2)}
    t = A.learning(cells)["test"]
    assert t["seeds"] == [4, 5, 6, 7] and t["left_out"] == [3]  # seed 3: neither passed 0.1
    assert t["a_best"] == [0.40, 0.50, 0.45, 0.55] and t["b_best"] == [0.99, 0.97, 0.98, 0.96]
    assert t["p"] == pytest.approx(2 / 70) and t["effect"] < 0 and t["confirmed"] is True  # 4 wholly below 4
    cells["fp8-router/r3/n4"]["runs"]["3"]["best_heldout"] = 0.2  # seed 3 now counts, and R3 is the higher there
    t = A.learning(cells)["test"]
    assert t["seeds"] == [3, 4, 5, 6, 7] and t["left_out"] == [] and t["p"] > 0.05 and t["confirmed"] is False
    cells["fp8-router/r3/n4"]["runs"]["3"]["best_heldout"] = 0.0
    for s in (4, 5, 6, 7):  # R3 the higher: a small p the other way round is not a confirmation
        cells["fp8-router/r3/n4"]["runs"][str(s)]["best_heldout"] = 1.0
    t = A.learning(cells)["test"]
    assert t["p"] < 0.05 and t["effect"] > 0 and t["confirmed"] is False
    cells["fp8-router/r3/n4"]["runs"]["3"]["best_heldout"] = D.LEARN_FLOOR  # at the floor, not past it: left out
    cells["fp8-router/r2/n4"]["runs"]["3"]["best_heldout"] = 0.0
    assert A.learning(cells)["test"]["left_out"] == [3]
    del cells["fp8-router/r2/n4"]["runs"]["7"]
    assert A.learning(cells)["test"]["confirmed"] is None  # not every seed finished: undecided


def test_start_prediction_reads_seeds_5_to_7_once_their_n4_and_n8_runs_have_finished():
    cells = {c: dict(runs={}, alias_of=None if D.alias(c) == c else D.alias(c)) for c in D.grid_cells()}
    start = {5: 0.1, 6: 0.3, 7: 0.25}
    climb = {5: 0.2, 6: 0.9, 7: 0.6}
    for c in cells:
        for s in (5, 6, 7):
            if not cells[c].get("alias_of"):
                n = c.split("/")[2]
                cells[c]["runs"][str(s)] = dict(first_reward=start[s] + (0.01 if n == "n8" else 0.0),
                                                best_heldout=climb[s] if c == "fp32/none/n8" else 0.0)
    for c in cells:  # an aliased cell holds its twin's runs, as in grid.json: not counted twice
        if cells[c]["alias_of"]:
            cells[c]["runs"] = cells[cells[c]["alias_of"]]["runs"]
    m = A.start(cells)
    assert [r["runs"] for r in m["seeds"]] == [15] * 3
    assert [r["seed"] for r in m["seeds"]] == [5, 6, 7] and all(r["complete"] for r in m["seeds"])
    assert [r["n4_n8_runs"] for r in m["seeds"]] == [10] * 3  # every N = 4 and N = 8 cell, n1fresh not among them
    assert m["seeds"][0]["start"] == pytest.approx(0.1) and m["seeds"][0]["best_n4_n8"] == 0.2  # median of 15
    assert [r["fits"] for r in m["seeds"]] == [True, True, True] and m["holds"] is True
    cells["fp32/none/n8"]["runs"]["5"]["best_heldout"] = 0.51  # a low start that climbed past 0.5
    assert A.start(cells)["holds"] is False
    cells["fp32/none/n8"]["runs"]["5"]["best_heldout"] = D.START_CLIMB  # at 0.5, not past it: no climb
    assert A.start(cells)["holds"] is True
    cells["fp32/none/n8"]["runs"]["7"]["best_heldout"] = D.START_CLIMB  # a start of 0.25 that did not climb
    assert A.start(cells)["holds"] is False
    cells["fp32/none/n8"]["runs"]["7"]["best_heldout"] = 0.6
    for c in cells:  # seed 2 (int keys, as in memory) goes against the rule: it gave the idea, it is not tested
        if not cells[c]["alias_of"]:
            cells[c]["runs"][2] = dict(first_reward=0.1, best_heldout=0.9)
    m = A.start(cells)
    assert [r["seed"] for r in m["seeds"]] == [2, 5, 6, 7] and m["seeds"][0]["fits"] is False
    assert m["seeds"][0]["tested"] is False and m["holds"] is True
    assert "| 2 (gave the idea) | 0.1 | 15 | no climb | 0.9 (10) | **no** |" in report.start_table(m)
    del cells["fp8-router/r3/n8"]["runs"]["6"]
    m = A.start(cells)
    assert m["seeds"][2]["complete"] is False and m["seeds"][2]["fits"] is None and m["holds"] is None
    assert "| 6 | 0.3 | 14 | a climb | 0.9 (9) | — |" in report.start_table(m)
    for c in cells:  # a tested seed with no finished run: not in the table, and nothing decided
        cells[c]["runs"].pop("7", None)
    m = A.start(cells)
    assert 7 not in [r["seed"] for r in m["seeds"]] and m["holds"] is None


def test_run_summary_takes_the_first_steps_reward_as_the_start():
    rows = [dict(step=i, reward=0.1 * (i + 1), loss=0.0, grad_norm=1.0, **({"eval/accuracy": 0.2} if i % 2 else {}))
            for i in range(8)]
    assert rules.run_summary("abc", rows)["first_reward"] == pytest.approx(0.1)
    assert rules.run_summary("abc", rows, k=4)["first_reward"] == pytest.approx(0.1)  # n1fresh: step 0, not its block


def test_controls_are_one_setting_from_the_no_replay_cell_and_their_n_follows_its_rule():
    _, base, steps = D.cell_run("fp8-router/none/n4", 0, 3e-4, "R")
    out, dense, dense_steps = D.cell_run("fp8-router/dense/n4", 0, 3e-4, "R")
    assert [f for f in dense if f != "--dense"] == base and dense.count("--dense") == 1 and dense_steps == steps
    assert out == os.path.join("R", "fp8-router-dense-n4-lr0.0003-s0")
    _, clip, _ = D.cell_run("fp8-router/clip/n4", 0, 3e-4, "R")
    assert len(clip) == len(base) and {(a, b) for a, b in zip(base, clip) if a != b} == {("1", "0.2"), ("1e6", "0.28")}
    assert W.flag_value(clip, "--replay", "") == "none" and W.flag_value(clip, "--clip-low", "") == "0.2"
    assert D.control_cells(8) == ["fp8-router/none/n8", "fp8-router/r2/n8", "fp8-router/dense/n8", "fp8-router/clip/n8"]

    def grid(n4, n8):
        return dict(cells={"fp8-router/none/n4": dict(collapsed=n4), "fp8-router/none/n8": dict(collapsed=n8)})
    assert A.control_n(grid(3, 1)) == 4 and A.control_n(grid(1, 3)) == 8 and A.control_n(grid(2, 2)) == 4  # tie: 4


def test_control_verdict_follows_its_rule():
    def cell(k, n=8):
        return dict(collapsed=k, n=n, runs={str(s): dict(max_drawdown=0.1) for s in range(n)})
    cells = {"fp8-router/none/n4": cell(6), "fp8-router/r2/n4": cell(1), "fp8-router/dense/n4": cell(0),
             "fp8-router/clip/n4": cell(5)}
    v = A.control_verdict(cells, 4, range(8))
    assert v["decided"] and set(v["tests"]) == {"routing", "trust region"}
    r, t = v["tests"]["routing"], v["tests"]["trust region"]
    assert r["p"] == pytest.approx(fisher_exact(6, 8, 0, 8)) and r["p_holm"] == pytest.approx(2 * r["p"])
    assert r["reading"].startswith("supported") and t["reading"] == "not shown"  # 6 vs 0 passes Holm; 6 vs 5 not
    cells["fp8-router/dense/n4"], cells["fp8-router/none/n4"] = cell(6), cell(0)  # the control fell, not the MoE
    assert A.control_verdict(cells, 4, range(8))["tests"]["routing"]["reading"] == "the dense control collapsed more"
    cells["fp8-router/none/n4"], cells["fp8-router/dense/n4"] = cell(5), cell(0)  # p = 0.026: not after Holm over 2
    assert A.control_verdict(cells, 4, range(8))["tests"]["routing"]["reading"] == "not shown"
    assert not A.control_verdict(cells, 4, range(8), probe=True)["decided"]  # a probe decides nothing
    cells["fp8-router/clip/n4"] = cell(0, n=7)  # a seed missing: provisional
    assert not A.control_verdict(cells, 4, range(8))["decided"]
    del cells["fp8-router/clip/n4"]  # no runs yet: still Holm over 2, so 5 vs 0 stays unshown
    v = A.control_verdict(cells, 4, range(8))
    assert v["tests"]["trust region"]["reading"] == "no runs yet" and v["tests"]["routing"]["reading"] == "not shown"
    assert v["tests"]["routing"]["p_holm"] == pytest.approx(2 * fisher_exact(5, 8, 0, 8))


def test_controls_refuse_a_partial_missing_or_foreign_grid(tmp_path, capsys):
    args = G.parse_args(["--controls", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="grid.json: cannot read the grid"):
        G.controls(args, 0.0)
    cells = {f"fp8-router/none/n{k}": dict(collapsed=1, n=8) for k in (4, 8)}
    grid = dict(complete=False, seeds=list(D.SEEDS), lr=D.LR, steps=D.STEPS, cells=cells)
    for bad, message in [([], "not a grid.json"), (dict(grid, cells={}), "not a grid.json"),
                         (grid, "the grid is partial"),
                         (dict(grid, complete=True, seeds=[0]), "not the pre-registered")]:
        (tmp_path / "grid.json").write_text(json.dumps(bad))
        with pytest.raises(SystemExit, match=message):
            G.controls(args, 0.0)
    assert not (tmp_path / "runs").exists()
    for argv in (["--controls", "--control-n", "1"],  # only 4 or 8: the grid's N with stale mini-steps
                 ["--pilot", "--controls"], ["--control-n", "4"]):  # one run at a time; an N needs --controls
        with pytest.raises(SystemExit) as e:
            G.parse_args(argv)
        assert e.value.code == 2
    assert "--control-n sets the controls' N: it needs --controls" in capsys.readouterr().err


def test_controls_end_to_end(tmp_path):
    cmd = [sys.executable, "-m", "experiments.staleness", "--controls", "--control-n", "4", "--seeds", "0",
           "--steps", "2", "--common", TINY, "--lr", "1e-3", "--out", "out"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "### What the controls say" in r.stdout and "given by --control-n" in r.stdout
    assert "**a probe**" in r.stdout and "A probe: no reading is a result." in r.stdout
    data = json.loads((tmp_path / "out" / "controls.json").read_text())
    assert data["N"] == 4 and data["control_rule"] == D.CONTROL_TEXT and data["probe"] and not data["complete"]
    assert set(data["cells"]) == set(D.control_cells(4)) and all(c["n"] == 1 for c in data["cells"].values())
    assert {(t["a"], t["b"]) for t in data["tests"]} == {(a, b) for a in D.control_cells(4)[:2]
                                                         for b in D.control_cells(4)[2:]}
    assert set(data["verdict"]["tests"]) == {"routing", "trust region"}
    assert (tmp_path / "out" / "controls.png").stat().st_size > 10_000
    flags = json.loads((tmp_path / "out" / "runs" / "fp8-router-dense-n4-lr0.001-s0" / "sweep_flags.json").read_text())
    assert "--dense" in flags and W.flag_value(flags, "--replay", "") == "none"


def test_grid_refuses_to_run_before_the_pilot_sets_lr(tmp_path, monkeypatch):
    monkeypatch.setattr(G, "LR", None)  # the LR grid.py reads
    with pytest.raises(SystemExit, match="LR is not set"):
        G.grid(G.parse_args(["--seeds", "0", "--steps", "2", "--out", str(tmp_path)]), 0.0)
    assert not (tmp_path / "runs").exists()


def test_grid_end_to_end(tmp_path):
    cmd = [sys.executable, "-m", "experiments.staleness", "--seeds", "0", "--steps", "2", "--common", TINY,
           "--out", "out"]
    r = subprocess.run([*cmd, "--lr", "1e-3"], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rule (pre-registered)" in r.stdout and "### Every run, by seed" in r.stdout
    data = json.loads((tmp_path / "out" / "grid.json").read_text())
    assert data["complete"] and set(data["cells"]) == set(D.grid_cells())
    assert data["selection_rule"] == D.SELECTION_TEXT and data["most_separating"]["N"] in D.MINI_STEPS
    assert data["mechanism_rule"] == D.MECHANISM_TEXT and data["mechanism"]["verdict"] in ("(a)", "(b)", "(a) and (b)",
                                                                                           "(c)")
    assert "### Which mechanism" in r.stdout and "### Does R3 climb less?" in r.stdout
    assert data["learning_rule"] == D.LEARN_TEXT and data["learning"]["test"]["confirmed"] is None  # seed 0 only
    assert data["start_rule"] == D.START_TEXT and data["start"]["holds"] is None  # seed 0 gave the idea: no test
    assert [r["seed"] for r in data["start"]["seeds"]] == [0] and "### Does a seed's start say" in r.stdout
    assert data["cells"]["fp32/r2/n1"]["alias_of"] == "fp32/none/n1"
    assert data["cells"]["fp32/r2/n1"]["runs"] == data["cells"]["fp32/none/n1"]["runs"]
    for c in data["cells"].values():
        run = c["runs"]["0"]
        assert {"collapse_step", "why", "max_drawdown", "best_heldout", "final_heldout", "max_grad_norm",
                "mean_kl", "first_reward"} <= set(run)
    fresh = data["cells"]["fp32/none/n1fresh"]["runs"]["0"]
    assert fresh["steps"] == 2  # 8 steps of a quarter of the prompts, read as 2 blocks of 4
    assert {t["metric"] for t in data["tests"]} == {"collapsed", "max_drawdown"}
    assert all(0 < t["p"] <= 1 for t in data["tests"])
    assert (tmp_path / "out" / "grid.png").stat().st_size > 10_000
    records = sorted((tmp_path / "out" / "records").iterdir())
    assert len(records) == len({D.alias(c) for c in D.grid_cells()})  # one per distinct run
    shutil.rmtree(tmp_path / "out" / "runs")  # a fresh clone has only the committed records
    r = subprocess.run([*cmd, "--lr", "1e-3", "--report"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    again = json.loads((tmp_path / "out" / "grid.json").read_text())
    assert again["complete"] and again["cells"] == data["cells"] and again["tests"] == data["tests"]
    records[0].write_bytes(records[0].read_bytes()[:100])  # a damaged record: one clear line, exit 1
    r = subprocess.run([*cmd, "--lr", "1e-3", "--report"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=ENV)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"error: out/records/{records[0].name}: not a readable run record" in r.stderr
    records[0].unlink()
    r = subprocess.run([*cmd, "--lr", "1e-3", "--seeds", "0", "1", "--report"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=ENV)  # seed 1 never ran: a partial grid, said so
    assert r.returncode == 0 and "**partial**" in r.stdout
    assert not json.loads((tmp_path / "out" / "grid.json").read_text())["complete"]


def fake_run(out, flags, rows, steps=3):
    out.mkdir(parents=True)
    (out / "sweep_flags.json").write_text(json.dumps([*flags, "--steps", str(steps)]))
    (out / "done.json").write_text(json.dumps(dict(steps=steps, stopped_on=None)))
    (out / "provenance.json").write_text(json.dumps(dict(commit="abc123")))
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_run_records(tmp_path):
    rows = [dict(step=i, reward=1 / 3 + i, loss=0.1 * i, step_time=1.0 + i, symptoms=[]) for i in range(3)]
    flags = ["--seed", "0", "--lr", "3e-4"]
    fake_run(tmp_path / "runs" / "a-s0", flags, rows)
    records = str(tmp_path / "records")
    head, got = W.finished(str(tmp_path / "runs" / "a-s0"), flags, 3, records)  # the folder is done: recorded
    assert head["commit"] == "abc123" and head["flags"] == [*flags, "--steps", "3"] and "earlier_commits" not in head
    assert [r["step"] for r in got] == [0, 1, 2] and all("step_time" not in r for r in got)
    assert [r["reward"] for r in got] == pytest.approx([r["reward"] for r in rows], rel=1e-6)
    path = W.record_path(str(tmp_path / "runs" / "a-s0"), records)
    first = open(path, "rb").read()
    W.write_record(str(tmp_path / "runs" / "a-s0"), records)
    assert open(path, "rb").read() == first  # the same run makes the same bytes
    shutil.rmtree(tmp_path / "runs")
    assert W.finished(str(tmp_path / "runs" / "a-s0"), flags, 3, records)[1] == got  # the record alone
    assert W.finished(str(tmp_path / "runs" / "a-s0"), flags, 4, records) is None  # not that far: rerun
    with pytest.raises(RuntimeError, match="different flags"):
        W.finished(str(tmp_path / "runs" / "a-s0"), ["--seed", "1", "--lr", "3e-4"], 3, records)
    open(path, "wb").write(first[: len(first) // 2])
    with pytest.raises(ValueError, match="a-s0.jsonl.gz: not a readable run record"):
        W.finished(str(tmp_path / "runs" / "a-s0"), flags, 3, records)
    fake_run(tmp_path / "runs" / "b-s0", flags, rows)  # resumed at another commit: the record says both
    (tmp_path / "runs" / "b-s0" / "provenance.json").write_text(json.dumps(dict(
        commit="def456", cpu="AMD EPYC [avx2]", segments=[dict(commit="abc123", dirty=False, started="t0",
                                                               finished=None, cpu="Intel(R) Xeon(R) [amx_bf16]")])))
    head = W.read_record(W.write_record(str(tmp_path / "runs" / "b-s0"), records))[0]
    assert head["commit"] == "def456" and head["earlier_commits"] == ["abc123"]
    assert head["cpu"] == "AMD EPYC [avx2]" and head["earlier_cpus"] == ["Intel(R) Xeon(R) [amx_bf16]"]  # both kinds


def test_a_failed_run_raises_with_the_end_of_its_log(tmp_path):
    """A CI log keeps only the sweep's output, not the run logs: the error must carry why the run failed."""
    runs = [(str(tmp_path / "bad-s0"), ["--seed", "0", "--no-such-flag"], 3)]
    with pytest.raises(RuntimeError, match=r"(?s)run .*bad-s0 failed \(exit 2\); the end of .*bad-s0\.log:\n"
                                           r".*unrecognized arguments: --no-such-flag"):
        W.run_all(runs, jobs=1, log_dir=str(tmp_path / "logs"))
    (tmp_path / "x.log").write_bytes(b"step 1\rstep 2\rstep 3\nwindows line\r\nlast line\n\n")
    assert W.log_tail(str(tmp_path / "x.log")) == "step 3\nwindows line\nlast line"  # a bar's redraws collapse
    assert W.log_tail(str(tmp_path / "none.log")).startswith("(unreadable: ")
