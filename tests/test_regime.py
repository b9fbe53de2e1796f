"""What this proves: the regime study's cells differ from their neighbours in exactly the flag they are named by
(arms: --replay; positions: --router-levels; the clipped update: the clip flags), its measurement reports the
mismatch the trainer's own metrics report (the oracle ~0, R3 below no replay under a strong dial), and its rules
(paper-matched position, depth, steps, intervals, per-run numbers, tests and the Holm-corrected answer) compute what
design.py says they do."""
import json
import math
import os

import pytest

from experiments.regime import design
from experiments.regime.calibrate import closest, depth_rule, interval, steps_rule
from experiments.regime.grid import answer, cell_entry, cell_run, compare, kl_trend, run_row
from experiments.regime.measure import Spec, measure
from experiments.sweep import flag_dict
from r3.model.model import build_model
from r3.tasks.tasks import make_task
from r3.train.warmup import preset_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flags_of(cell, seed=0):
    """{flag: value (True for a switch)} of one run's command line; a flag given twice would be a bug."""
    return flag_dict(cell_run(cell, seed, "R", 600, paper="lv15", walk_T=64)[1])


def diff(a, b):
    fa, fb = flags_of(a), flags_of(b)
    return {k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)}


def test_cells_differ_in_exactly_their_flag():
    assert diff("lv3/none/n4", "lv3/r3/n4") == {"--replay"}
    assert diff("lv3/r2/n4", "lv3/r3/n4") == {"--replay"}
    assert diff("lv3/none/n4", "lv3/none/n1") == {"--mini-steps"}
    assert diff("lv3/none/n4", "lv7/none/n4") == {"--router-levels"}
    assert diff("lv3/none/n4", "natural/none/n4") == {"--router-levels"}
    assert diff("natural/none/n4", "oracle/none/n4") == {"--rollout-dtype"}
    assert diff("lv3/none/n4", "lv3-clip/none/n4") == {n for n, _ in design.CLIP_FLAGS}
    assert diff("natural/none/n4", "deep/none/n4") == {"--preset"}
    assert diff("lv15/none/n4", "walk/none/n4") == {"--task"}
    assert flags_of("lv3/none/n4", 5)["--seed"] == "5" and flags_of("lv3/none/n4")["--warmup-until"] == "0.3"
    cells = [c for tier in design.tier_cells("lv15").values() for c in tier]
    assert len(cells) == len(set(cells)) and len(design.tier_cells("lv15")[1]) == 13


@pytest.fixture(scope="module")
def toy():
    task = make_task("cipher:8-8")
    return build_model(preset_config("toy", task), 0), task


def test_measure_reports_the_mismatch_of_its_engine(toy):
    model, task = toy
    oracle = measure(model, task, Spec("o", "cipher:8-8", "fp32", None), prompts=8, samples=4)
    strong = measure(model, task, Spec("s", "cipher:8-8", "fp8-router", 3), prompts=8, samples=4)
    assert oracle["kl"] < 1e-9 and oracle["router_flip_rate"] == 0
    assert strong["router_flip_rate"] > 0.1 and strong["kl_r3"] < strong["kl"]
    assert strong["abs_log_ratio_q50"] <= strong["abs_log_ratio_q90"] <= strong["abs_log_ratio_q99.9"]
    assert strong["exposure"] == pytest.approx(strong["response_length"] * strong["kl"])
    assert strong["tokens"] > 0 and 0 <= strong["token_flip_rate"] <= 1


def test_interval_is_a_t_interval():
    r = interval([1.0, 2.0, 3.0])
    assert r["mean"] == 2.0 and r["hi"] - 2.0 == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert interval([None, 1.0])["lo"] is None and interval([])["mean"] is None


def test_paper_matched_position_is_the_closest_router_flip_rate():
    table = {p: {"start": {"router_flip_rate": {"mean": v}}} for p, v in
             zip(design.POSITIONS, (0.02, 0.07, 0.14, 0.2, 0.4))}
    assert closest(table, "router_flip_rate", 0.10) == "lv15"


def test_depth_rule_takes_the_shallowest_depth_that_passes():
    res = {f"depth-{L}-s{s}": {"token_flip_rate": v} for L, v in ((6, 0.6), (12, 0.88), (24, 0.93))
           for s in design.DEPTH_SEEDS}
    assert depth_rule(res) == dict(depth=24, measured={6: 0.6, 12: 0.88, 24: 0.93}, decided=True)
    del res["depth-24-s1"]
    assert depth_rule(res)["decided"] is False
    res["depth-24-s1"] = {"token_flip_rate": 0.5}
    res["depth-24-s0"] = {"token_flip_rate": 0.5}  # every shallower depth failed: the fallback, measured or not
    assert depth_rule(res) == dict(depth=48, measured={6: 0.6, 12: 0.88, 24: 0.5}, decided=True)


def test_depths_are_measured_until_the_rule_decides_and_the_fallback_too(monkeypatch):
    from experiments.regime import calibrate
    flips = {"6": 0.5, "12": 0.6, "24": 0.7, "48": 0.8}
    asked = []

    def fake(out, jobs, workers):
        asked.append(jobs[0][1])
        return {f"depth-{name}-s{s}": {"token_flip_rate": flips[name]} for _, name, s, _ in jobs}
    monkeypatch.setattr(calibrate, "measure_all", fake)
    res = {}
    assert calibrate.measure_depths("out", res, 1) == dict(depth=48, measured={6: 0.5, 12: 0.6, 24: 0.7, 48: 0.8},
                                                           decided=True)
    assert asked == ["6", "12", "24", "48"]
    flips["12"], asked[:] = 0.95, []
    assert calibrate.measure_depths("out", {}, 1)["depth"] == 12 and asked == ["6", "12"]


def test_steps_rule():
    rows = [[dict(step=s, **{"eval/accuracy": a}) for s, a in zip((49, 99, 149, 199), accs)]
            for accs in ((0.1, 0.5, 0.8, 0.81), (0.1, 0.5, 0.8, 0.79))]
    r = steps_rule(rows)
    assert r["plateau_step"] == 149 and r["steps"] == design.MIN_STEPS  # 149 + 1 + 100 -> 300 -> at least 600
    late = [[dict(step=s, **{"eval/accuracy": s / 1000}) for s in range(49, 1000, 50)]] * 2
    assert steps_rule(late)["steps"] == design.PILOT_STEPS


def rows_of(kls, accs):
    return [dict(step=i, reward=0.5, loss=0.0, grad_norm=1.0, kl=k, **({"eval/accuracy": accs[i // 50]}
                                                                      if i % 50 == 49 else {}))
            for i, k in enumerate(kls)]


def test_run_row_numbers():
    rows = rows_of([1e-3] * 100 + [1e-2] * 100, [0.2, 0.6, 0.1, 0.05])
    r = run_row("abc", rows)
    assert r["kl_trend"] == pytest.approx(1.0) and r["heldout_area"] == pytest.approx(0.2375)
    assert r["max_drawdown"] == pytest.approx(0.55) and r["collapse_step"] == 149 and r["best_heldout"] == 0.6
    assert kl_trend([dict(step=0, kl=None)]) is None
    assert r["median_max_log_ratio"] is None and r["steps_log_ratio_over_10"] is None  # not logged: no number
    for i, x in enumerate(rows):
        x["grpo/max_abs_log_ratio"] = [0.5, 12.0, 3.0][i % 3]
    r = run_row("abc", rows)
    assert r["median_max_log_ratio"] == 3.0 and r["steps_log_ratio_over_10"] == 67  # steps 1, 4, ..., 199
    assert r["served_gap"] is None  # no greedy accuracies logged: no number
    for x, (trainer, engine) in zip([x for x in rows if "eval/accuracy" in x], [(1.0, 0.75), (0.5, 0.5), (0.5, 0.0),
                                                                               (0.75, None)]):
        x.update({"eval/accuracy_greedy_trainer": trainer, "eval/accuracy_greedy": engine})
    assert run_row("abc", rows)["served_gap"] == pytest.approx(0.25)  # (0.25 + 0 + 0.5) / 3: the fourth has no pair


def test_tests_and_answer_read_the_predicted_direction():
    fell, held = rows_of([1e-3] * 200, [0.2, 0.6, 0.1, 0.05]), rows_of([1e-3] * 200, [0.2, 0.6, 0.7, 0.8])
    cells = {}
    for p in design.POSITIONS:
        n_fell = 8 if p == design.STRONGEST else 0
        for arm, runs in (("none", {s: run_row(None, fell if s < n_fell else held) for s in range(8)}),
                          ("r3", {s: run_row(None, held) for s in range(8)})):
            cells[f"{p}/{arm}/n4"] = dict(collapsed=sum(r["collapse_step"] is not None for r in runs.values()),
                                          n=8, runs=runs)
    for cell in (f"{design.STRONGEST}/r2/n4", "lv15/r2/n4", "oracle/none/n4"):  # none is tested against these too
        cells[cell] = dict(collapsed=8, n=8, runs={s: run_row(None, fell) for s in range(8)})
    ts = compare(cells, "lv15")
    a = answer(ts, complete=True)
    strong = next(r for r in a["positions"] if r["position"] == design.STRONGEST)
    assert strong["p"] == pytest.approx(2 / math.comb(16, 8)) and strong["r3_holds"]  # 8/8 vs 0/8: two tables
    assert strong["p_holm"] == pytest.approx(min(1.0, 5 * strong["p"]))
    assert a["pick"]["position"] == design.STRONGEST and a["separates"]
    assert not any(r["r3_holds"] for r in a["positions"] if r["position"] != design.STRONGEST)
    assert not answer(ts, complete=False)["separates"]


def test_grid_report_and_figures_from_finished_runs(tmp_path):
    """The grid's tables, dose-response and figures from synthetic finished runs (a partial grid included)."""
    from experiments.regime import plots
    from experiments.regime.run_grid import deep_runs, deep_state, deep_steps, dose, report_md, survival, walk_length
    start = {p: {"start": {k: {"mean": v} for k, v in (("router_flip_rate", 0.03 + 0.1 * i),
                                                        ("token_flip_rate", 0.1 + 0.2 * i), ("exposure", 0.1 * i))}}
             for i, p in enumerate([*design.POSITIONS, "oracle"])}
    cal = dict(table=start, paper_matched="lv15", pilot=dict(steps=600), depth=dict(decided=True, depth=48),
               timing=dict(step_time_s=dict(deep=4.0)), walk={"64": {"exposure": {"mean": 0.4}}})
    assert deep_steps(cal, 600) == 400 and walk_length(cal) is None  # 8 h / (16 runs x 4 s x 1.1) = 409 steps
    assert deep_runs(cal) == (False, "its start-matched warm-ups at 48 layers are not measured yet")
    cal["deep_warmup"] = {"0": dict(reached=False, probe_reward=0.17)}
    assert deep_runs(cal) == (False, "its start-matched warm-up did not reach 0.3 within 400 steps on seeds [0, 1] "
                                     "(probe rewards [0.17, None])")
    cal["deep_warmup"] = {"0": dict(reached=True, probe_reward=0.31), "1": dict(reached=True, probe_reward=0.33)}
    assert deep_runs(cal) == (True, "400 steps")
    cal["timing"]["step_time_s"]["deep"] = 12.0
    assert deep_runs(cal) == (False, "only 100 steps fit the 8 core-hour budget")
    no_warmups = {k: v for k, v in cal.items() if k != "deep_warmup"}  # the budget decides before the warm-ups
    assert deep_state(no_warmups) == (False, "only 100 steps fit the 8 core-hour budget", False)
    cal["timing"]["step_time_s"]["deep"] = 4.0
    assert deep_state(no_warmups)[2] and not deep_state(cal)[2]  # 400 steps fit: pending on its warm-ups
    fell, held = rows_of([1e-3] * 200, [0.2, 0.6, 0.1, 0.05]), rows_of([1e-3] * 200, [0.2, 0.6, 0.7, 0.8])
    cells, rows_by = {}, {}
    for i, p in enumerate(design.POSITIONS):
        for arm in ("none", "r3"):
            runs = {}
            for s in range(8 if p != "natural" else 3):  # partial at the weakest position
                rows = fell if arm == "none" and s < 2 * i else held
                runs[s], rows_by[f"{p}/{arm}/n4", s] = run_row("c", rows), rows
            cells[f"{p}/{arm}/n4"] = dict(collapsed=sum(r["collapse_step"] is not None for r in runs.values()),
                                          n=len(runs), runs=runs)
    data = dict(rule="R", tests_text="T", selection_text="S", predictions=("P",), common="--x", steps=600,
                deep_steps=550, deep=dict(run=False, why="the depth rule is undecided"), seeds=list(range(8)), tiers=[1], complete={1: False}, paper_matched="lv15",
                settings={p: v["start"] for p, v in start.items()}, cells=cells,
                tests=compare(cells, "lv15"), answer=answer(compare(cells, "lv15"), False), dose=dose(cells, cal),
                survival=survival(cells, 600))
    d = data["dose"]["router_flip_rate/none"]
    assert d["b"] > 0 and 0 < d["x50"] < 1 and d["x50_interval"]["draws"] == 2000
    assert data["dose"]["router_flip_rate/r3"]["collapsed"] == 0 and data["dose"]["router_flip_rate/r3"]["a"] is None
    assert data["survival"]["lv3/none/n4"][0] == [0, 1.0] and data["survival"]["lv3/none/n4"][-1] == [600, 0.0]
    settings = {p: {k: v["mean"] for k, v in s.items()} for p, s in data["settings"].items()}
    md = report_md({**data, "settings": settings})
    assert "**partial: 70 of 80 runs finished**" in md and "| lv3/none/n4 |" in md and "provisional" in md
    assert "no replay collapsed 8 of 8, R3 0 of 8 (Fisher p 0.000155)" in md  # lv3: every no-replay seed fell
    assert "(none - r3 -0.337 [-0.337, -0.337], p 0.00781)" in md  # every seed the same difference: 2 / 2^8
    for name in plots.FIGURES:
        plots.grid_figure(cells, rows_by, cal, str(tmp_path / name), name)
        assert (tmp_path / name).stat().st_size > 10_000
    plots.dose_figure(data, cal, str(tmp_path / "dose.png"))
    assert (tmp_path / "grid.png").stat().st_size > 10_000 and (tmp_path / "dose.png").stat().st_size > 10_000


def test_dose_fits_only_when_runs_differ_and_marks_a_crossing_beyond_the_data():
    """Every run collapsed (or none): no fit, not a crossing of rounding noise's sign (it was -1.45e12); a crossing
    outside the measured flip rates is marked; the bootstrap counts draws already past 50 % apart."""
    from experiments.regime.run_grid import dose
    from experiments.stats import bootstrap_crossing
    start = lambda i: {"router_flip_rate": {"mean": 0.03 + 0.08 * i}, "token_flip_rate": {"mean": 0.1 + 0.2 * i}}  # noqa
    cal = dict(table={p: {"start": start(i)} for i, p in enumerate(design.POSITIONS)})
    fell = run_row(None, rows_of([1e-3] * 200, [0.2, 0.6, 0.1, 0.05]))
    held = run_row(None, rows_of([1e-3] * 200, [0.5] * 4))
    cells = {f"{p}/none/n4": cell_entry({s: fell for s in range(4)}) for p in design.POSITIONS}
    e = dose(cells, cal)["router_flip_rate/none"]
    assert e["collapsed"] == 20 and e["a"] is None and e["x50"] is None and e["x50_interval"]["passed"] == 1.0
    cells = {f"{p}/none/n4": cell_entry({s: fell if p == design.STRONGEST and s == 0 else held for s in range(4)})
             for p in design.POSITIONS}  # one collapse, at the strongest position: the fit crosses beyond it
    e = dose(cells, cal)["router_flip_rate/none"]
    assert e["x50"] > e["range"][1] and e["x50_beyond"]
    iv = bootstrap_crossing([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1])
    # a draw of four runs all collapsed (1/16 of draws) is 'passed', all held (1/16) 'not reached'; symmetric data
    assert abs(iv["passed"] - 1 / 16) < 0.02 and abs(iv["not_reached"] - 1 / 16) < 0.02 and iv["lo"] < 0.25 < iv["hi"]


def test_report_median_and_completeness_and_record_rounding():
    """The grad-norm median of an even count is the mean of the middle two; a report over fewer seeds or tiers than
    the design is never 'complete'; drawdowns equal up to the records' 7 digits tie in the paired test."""
    from types import SimpleNamespace
    from experiments.regime.grid import _paired
    from experiments.regime.run_grid import completeness, report_md
    row = lambda g: dict(run_row(None, rows_of([1e-3] * 200, [0.5] * 4)), max_grad_norm=g)  # noqa: E731
    cells = {c: cell_entry({0: row(10.0), 1: row(20.0)}) for c in design.tier_cells("lv7", deep=False, walk=False)[1]}
    cal = dict(paper_matched="lv7", depth=dict(decided=True, depth=48), pilot=dict(steps=800),
               timing=dict(step_time_s=dict(deep=10.75)))
    for tiers, seeds in (([1], [0, 1]), ([1], list(range(8)))):
        assert not completeness(cells, cal, SimpleNamespace(tiers=tiers, seeds=seeds))[1]
    full = {c: cell_entry({s: row(10.0) for s in range(8)}) for c in cells}
    assert completeness(full, cal, SimpleNamespace(tiers=[1], seeds=list(range(8)))) == {1: True, 2: False}
    d = dict(cells=cells, complete={1: False, 2: False}, seeds=[0, 1], tiers=[1], rule="R", common="--x", steps=800,
             deep=dict(run=False, why="w"), paper_matched="lv7", settings={}, tests_text="T", tests=[],
             answer=dict(positions=[], pick=None, complete=False, separates=False), selection_text="S", dose={},
             predictions=["P"])
    md = report_md(d)
    assert "| 15 |" in md and "(complete)" not in md and "partial" in md
    md = report_md({**d, "complete": {1: True, 2: False}, "progress": {"1": [104, 104], "2": [3, 48]}})
    assert "; tier 1: 104 of 104, complete, tier 2: 3 of 48)" in md.split("\n")[0]
    a = {0: dict(max_drawdown=0.0625), 1: dict(max_drawdown=0.0390625)}
    b = {0: dict(max_drawdown=0.0), 1: dict(max_drawdown=0.0390624)}
    assert _paired(a, b, "max_drawdown")[1] == 1.0  # the second pair ties: one informative sign, p = 1


def test_tier2_lines_pair_each_tier2_cell_with_its_r3_twin():
    """Tier 2's report lines: none against R3 at 1 mini-step at the strongest and paper-matched positions and under
    the clipped update, each with its own cells' counts and tests, and only once both arms have finished a seed."""
    from experiments.regime.run_grid import report_md, tier2_lines
    fell = run_row(None, rows_of([1e-3] * 200, [0.2, 0.6, 0.1, 0.05]))
    held = run_row(None, rows_of([1e-3] * 200, [0.2, 0.6, 0.7, 0.8]))
    st = design.STRONGEST
    cells = {c: cell_entry({s: fell if c == f"{st}-clip/none/n4" and s < 3 else held for s in range(4)})
             for c in design.tier_cells("lv7", deep=False, walk=False)[2]}
    cells["lv7/r3/n1"] = cell_entry({})  # not started: its line waits
    d = dict(cells=cells, tests=compare(cells, "lv7"), paper_matched="lv7",
             settings={st: dict(router_flip_rate=0.367, token_flip_rate=0.834)})
    lines = tier2_lines(d)
    assert [x.split("**")[1] for x in lines] == [f"{st}, 1 mini-step", f"{st}-clip, 4 mini-steps, clipped update"]
    assert "no replay collapsed 0 of 4, R3 0 of 4 (Fisher p 1)" in lines[0] and "36.7 % of routers" in lines[0]
    assert "no replay collapsed 3 of 4, R3 0 of 4 (Fisher p 0.143)" in lines[1]  # two-sided: (4 + 4) / C(8, 3)
    md = report_md(dict(d, complete={1: False, 2: False}, seeds=[0, 1, 2, 3], tiers=[1, 2], rule="R", common="--x",
                        steps=800, deep=dict(run=False, why="w"), tests_text="T", selection_text="S", dose={},
                        answer=dict(positions=[], pick=None, complete=False, separates=False), predictions=["P"]))
    assert "## Tier 2, in numbers" in md and "--clip-low 0.2 --clip-high 0.28 --grad-clip 1.0" in md
    assert f"- **{st}-clip, 4 mini-steps, clipped update**" in md


def test_regime_report_from_the_committed_calibration_with_walk_rows(tmp_path):
    """The regime table's markdown, JSON and figure from the committed regime.json, with walk rows and a walk demo
    added: the walk length rule's outcome is said in words, both ways."""
    from experiments.regime import report
    with open(os.path.join(ROOT, "results", "regime", "regime.json")) as f:
        data = {k: v for k, v in json.load(f).items() if k != "provenance"}
    walk = lambda S: {k: dict(mean=v) for k, v in dict(  # noqa: E731
        token_flip_rate=0.64, kl=4e-3, kl_r3=2e-4, response_length=50.0, exposure=S, entropy=3.4, reward=0.3).items()}
    demo = [dict(seed=0, heldout=[[49, 0.1], [99, 0.5]], first_entropy=3.4, final_entropy=1.2, final_reward=0.8)]
    data.update(walk={"64": walk(0.25), "256": walk(0.67)}, walk_demo={"walk:64": demo, "cipher:32-32": demo})
    report.write_regime(str(tmp_path), data, t0=0.0)
    md = (tmp_path / "regime.md").read_text()
    assert "| 64 | 0.64 |" in md and "none does; tier 3 is not run" in md and "| walk:64 | 0 | 0.10, 0.50 |" in md
    assert "walk:64 learns (held-out exact accuracy above 0 at the last evaluation): seeds [0]" in md
    assert "1.2 nats per token against cipher:32-32's 1.2: **not above** it" in md
    assert (tmp_path / "regime.png").stat().st_size > 10_000
    data["walk_demo"]["walk:64"] = [dict(demo[0], heldout=[[49, 0.0], [99, 0.0]], final_entropy=2.0)]
    report.write_regime(str(tmp_path), data, t0=0.0)
    md = (tmp_path / "regime.md").read_text()
    assert "at the last evaluation): **no seed**" in md and "2 nats per token against cipher:32-32's 1.2: **above**" in md
    data["walk"]["256"] = walk(3.2)
    report.write_regime(str(tmp_path), data, t0=0.0)
    assert "the shortest T whose S reaches 3.0: **256**" in (tmp_path / "regime.md").read_text()
