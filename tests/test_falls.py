"""What this proves: experiments.staleness.falls reads its windows where its docstring says (the 50 steps before the
evaluation that preceded a collapse, and the fall itself; n1fresh's steps scaled by its block size), compares a fallen
run with the median of its cell's stable seeds only, and with height-matched windows of never-collapsed runs of its
engine and N, and on the committed staleness records finds every sustained collapse of grid.json once; a missing grid
table is one clear error."""
import json
import math
import subprocess
import sys
from pathlib import Path

from experiments.staleness import falls as F

ROOT = Path(__file__).resolve().parent.parent


def rows(values: dict[int, float], metric: str = "grad_norm") -> list[dict]:
    return [{"step": s, metric: v} for s, v in sorted(values.items())]


def test_window_median_reads_lo_to_hi_and_skips_missing_and_non_finite():
    r = rows({9: 100.0, 10: 1.0, 11: 3.0, 12: math.nan, 13: 2.0, 14: 100.0})
    r.append({"step": 13, "entropy": 5.0})  # another metric's row: not read
    assert F.window_median(r, "grad_norm", 10, 14) == 2.0
    assert F.window_median(r, "grad_norm", 20, 30) is None


def test_falls_compares_the_fallen_run_with_its_cells_stable_seeds_over_the_same_steps():
    C = 249
    grid = {"cells": {"e/none/n4": {"runs": {"0": {"collapse_step": C, "why": "heldout_drop"},
                                             "1": {"collapse_step": None}, "2": {"collapse_step": None},
                                             "3": {"collapse_step": 500, "why": "heldout_drop"}}}}}
    fallen = {s: (4.0 if 149 <= s < 199 else 9.0 if s >= 199 else 0.1) for s in range(300)}
    data = {("e/none/n4", "0"): rows(fallen), ("e/none/n4", "1"): rows({s: 1.0 for s in range(600)}),
            ("e/none/n4", "2"): rows({s: 3.0 for s in range(600)}),
            ("e/none/n4", "3"): rows({s: 50.0 for s in range(600)})}  # fell too: never a reference
    found = F.falls(grid, data, window=50)
    assert [(e["seed"], e["collapse_step"]) for e in found] == [(0, C), (3, 500)]
    e = found[0]
    assert e["window"] == [149, 199] and e["fall"] == [199, 250] and e["stable_seeds"] == [1, 2]
    m = e["metrics"]["grad_norm"]
    assert (m["fallen"], m["stable"], m["fallen_during"], m["stable_during"]) == (4.0, 2.0, 9.0, 2.0)
    assert e["metrics"]["entropy"] == dict(fallen=None, stable=None, fallen_during=None, stable_during=None)
    s = F.summarize(found)["grad_norm"]
    assert s["n"] == 2 and s["fallen_larger"] == 2 and math.isclose(s["geo_mean_ratio"], math.sqrt(2.0 * 25.0))


def test_n1fresh_windows_bracket_the_fall_in_raw_steps():
    """An n1fresh run evaluates every 200 raw steps (50 blocks of 4); its accuracy falls at raw step 799. The rule,
    read on blocks, gives C; the fall window [C - 50, C] must hold the raw fall and the good evaluation before it
    (block C - 50), the window before it the evaluation before that and not the fall."""
    from experiments.rules import run_summary
    raw = [dict(step=s, reward=1.0, loss=0.0, grad_norm=1.0, **({"eval/accuracy": 0.9 if s < 799 else 0.1}
                                                              if s % 200 == 199 else {})) for s in range(1200)]
    C = run_summary("abc", raw, k=4)["collapse_step"]
    assert C == 199  # block 199 = raw steps 796-799
    grid = {"cells": {"e/none/n1fresh": {"runs": {"0": {"collapse_step": C, "why": "heldout_drop"}}}}}
    e = F.falls(grid, {("e/none/n1fresh", "0"): raw}, window=50)[0]
    inside = lambda w, step: w[0] <= step < w[1]  # noqa: E731
    assert inside(e["fall"], 799) and inside(e["fall"], 599) and not inside(e["fall"], 399)
    assert inside(e["window"], 399) and not inside(e["window"], 599) and e["window"] == [396, 596]


def test_height_matched_reference_reads_same_engine_and_n_never_collapsed_runs_at_the_fallen_height():
    """Windows start at evaluations within HEIGHT_TOL of the fallen run's height, in never-collapsed runs of the same
    engine and N (any arm, any step); each run's matched windows give one median, the runs' medians one reference."""
    def run(evals: dict[int, float], grad: float, steps: int = 400) -> list[dict]:
        return [dict(step=s, grad_norm=grad + (s % 3 == 0) * 1e-3, **({"eval/accuracy": evals[s]} if s in evals
                                                                       else {})) for s in range(steps)]
    grid = {"cells": {"e/none/n4": {"runs": {"0": {"collapse_step": 249, "why": "heldout_drop"},
                                             "1": {"collapse_step": None}, "2": {"collapse_step": 399,
                                                                                 "why": "heldout_drop"}}},
                      "e/r3/n4": {"runs": {"0": {"collapse_step": None}}},
                      "e/none/n8": {"runs": {"0": {"collapse_step": None}}},
                      "f/none/n4": {"runs": {"0": {"collapse_step": None}}}}}
    data = {("e/none/n4", "0"): run({149: 0.5, 199: 0.55, 249: 0.1}, 7.0),
            ("e/none/n4", "1"): run({49: 0.2, 99: 0.46, 149: 0.9, 199: 0.54, 249: 0.56, 351: 0.5}, 1.0),
            ("e/none/n4", "2"): run({49: 0.5}, 50.0),  # collapsed later: never a reference
            ("e/r3/n4", "0"): run({299: 0.5, 350: 0.5}, 3.0),  # 350-399 is the last whole window; 351 has none
            ("e/none/n8", "0"): run({49: 0.5}, 60.0), ("f/none/n4", "0"): run({49: 0.5}, 70.0)}
    found = F.falls(grid, data, window=50)
    F.match_heights(grid, data, found)
    e = next(x for x in found if x["seed"] == 0)
    assert e["matched"] == dict(height=0.5, tol=F.HEIGHT_TOL, runs=2, windows=4)  # seed 1: 99, 199; r3: 299, 350
    m = e["metrics"]["grad_norm"]
    assert m["fallen_matched"] == m["fallen"] == 7.0
    assert math.isclose(m["stable_matched"], 2.0)  # median of seed 1's 1.0 and r3's 3.0
    assert "matched" not in next(x for x in found if x["seed"] == 2)  # no evaluation in its window: no height
    s = F.summarize(found, "_matched")["grad_norm"]
    assert s["n"] == 1 and s["fallen_larger"] == 1 and math.isclose(s["geo_mean_ratio"], 3.5)


def test_height_matched_n1fresh_windows_start_at_the_block_that_holds_the_evaluation():
    """n1fresh logs an evaluation at its block's last raw step (399 of 396-399); the fallen window starts at the
    block (396), so a matched one must too: a run whose rows end at 1395 holds the window of its evaluation at 1199
    only if it starts at 1196."""
    fallen = [dict(step=s, grad_norm=1.0, **({"eval/accuracy": 0.9 if s < 799 else 0.1} if s % 200 == 199 else {}))
              for s in range(1200)]
    stable = [dict(step=s, grad_norm=2.0, **({"eval/accuracy": 0.9 if s == 1199 else 0.0} if s % 200 == 199 else {}))
              for s in range(1396)]
    grid = {"cells": {"e/none/n1fresh": {"runs": {"0": {"collapse_step": 199, "why": "heldout_drop"},
                                                  "1": {"collapse_step": None}}}}}
    data = {("e/none/n1fresh", "0"): fallen, ("e/none/n1fresh", "1"): stable}
    found = F.falls(grid, data, window=50)
    F.match_heights(grid, data, found)
    assert found[0]["window"] == [396, 596] and found[0]["matched"]["windows"] == 1
    assert found[0]["metrics"]["grad_norm"]["stable_matched"] == 2.0


def test_summary_skips_falls_without_a_held_out_bracket_and_kl_at_rounding_level():
    m = lambda a, b: {k: dict(fallen=a, stable=b, fallen_during=a, stable_during=b) for k in F.METRICS}  # noqa
    found = [dict(why="heldout_drop", metrics=m(2.0, 1.0)), dict(why="reward_drop", metrics=m(100.0, 1.0))]
    assert F.summarize(found)["grad_norm"]["n"] == 1 and F.summarize(found)["grad_norm"]["geo_mean_ratio"] == 2.0
    found = [dict(why="heldout_drop", metrics=m(4e-16, 3e-17))]  # the fp32 engine's kl: rounding
    assert F.summarize(found)["kl"]["n"] == 0 and F.summarize(found)["grad_norm"]["n"] == 1


def test_on_the_committed_staleness_records(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.staleness.falls", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    grid = json.loads((ROOT / "results" / "staleness" / "grid.json").read_text())
    expected = sorted((c, int(s), run["collapse_step"]) for c, cell in grid["cells"].items()
                      if not cell["alias_of"] for s, run in cell["runs"].items() if run["collapse_step"] is not None)
    got = json.loads((tmp_path / "falls.json").read_text())
    assert sorted((e["cell"], e["seed"], e["collapse_step"]) for e in got["falls"]) == expected
    assert "Exploratory (not pre-registered)" in r.stdout and (tmp_path / "falls.png").stat().st_size > 10_000


def test_a_missing_grid_is_one_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.staleness.falls", "--grid", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"{tmp_path}/grid.json: no grid table" in r.stderr
