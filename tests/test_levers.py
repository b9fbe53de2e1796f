"""What this proves: the levers' design (experiments/regime/levers.py) is what its runs carry (each grid arm one flag
from its base, the lag cells with --rollout-lag K, the low-bit cells with their preset and int4 engine, fresh seeds
disjoint from 0-31, every command line one train.py accepts; the rows' runs the regime grid's natural/none/n4 plus
the lever, K = 0 read from that grid's committed records with matching flags); its rules (K*, the int4 fallback, the
16-seed extension) compute what the design says; a lag row and a low-bit row are measured end to end on tiny
settings (the probe samples with the lagged engine the checkpoint holds); and the report marks partial rows."""
import json
import os
import subprocess
import sys

import pytest

from experiments.regime import design, levers
from experiments.regime.grid import cell_entry, cell_run
from experiments.regime.levers_measure import (_job, lag_probe, lag_result, lag_window, lowbit_spec, regime_rows,
                                               row_run)
from experiments.regime.levers_report import int4_preset, lag_choice, rows_data, write_rows
from experiments.regime.levers_run import decided, extended, grid_run, grid_tests, plan, write_grid
from experiments.regime.measure import Spec, measure
from experiments.sweep import flag_dict
from r3.errors import InputError
from r3.model.model import build_model
from r3.runs.io import atomic_write_json, read_jsonl
from r3.tasks.tasks import make_task
from r3.train.config import TrainConfig, parse
from r3.train.warmup import preset_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def diff(a, b):
    fa, fb = flag_dict(a), flag_dict(b)
    return {k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)}


def test_grid_arms_are_one_flag_from_their_base_and_carry_their_lever():
    cells = levers.grid_cells(4, "qwen3-ratio")
    assert len(cells) == len(set(cells)) == 10 and len(levers.grid_cells(1, "toy")) == 7  # K* = 1: one lag setting
    f = {c: grid_run(c, 32, "R")[1] for c in cells}
    for s in ("lag1-clip", "lag4-clip", "qwen3-ratio-int4-clip"):
        assert diff(f[f"{s}/none/n4"], f[f"{s}/r3/n4"]) == {"--replay"}
        assert diff(f[f"{s}/none/n4"], f[f"{s}/tis/n4"]) == {"--is-correction"}
    q = "qwen3-ratio-int4-clip"
    assert diff(f[f"{q}/r3/n4"], f[f"{q}/r3-tis/n4"]) == {"--is-correction"}
    assert diff(f[f"{q}/tis/n4"], f[f"{q}/r3-tis/n4"]) == {"--replay"}
    assert diff(f["lag1-clip/none/n4"], f["lag4-clip/none/n4"]) == {"--rollout-lag"}
    assert diff(f["lag1-clip/none/n4"], f[f"{q}/none/n4"]) == {"--rollout-lag", "--preset", "--rollout-dtype"}
    base = cell_run("natural-clip/none/n4", 32, "R", 800)[1]  # the regime grid's clipped update, the natural engine
    assert diff(base, f["lag4-clip/none/n4"]) == {"--rollout-lag", "--is-cap"}
    for c, argv in f.items():
        d = flag_dict(argv)
        assert d["--old-logp"] == "trainer" and d["--clip-low"] == "0.2" and d["--grad-clip"] == "1.0"
        assert d["--is-cap"] == "2" and d["--mini-steps"] == "4" and d["--warmup-until"] == "0.3"
        assert d.get("--rollout-lag") == (c[3] if c.startswith("lag") else None)
        cfg = parse(TrainConfig, argv + ["--steps", "800"])  # train.py accepts it (TIS: the trainer's π_old)
        assert cfg.rollout_dtype == ("int4" if c.startswith(q) else "fp8-router")
    assert grid_run(cells[0], 39, "R")[0] == os.path.join("R", "lag1-clip-none-n4-s39")
    seeds = set(levers.GRID_SEEDS + levers.EXTRA_SEEDS)
    assert seeds == set(range(32, 48)) and not seeds & set(range(32))


def test_row_runs_are_the_regime_grids_natural_runs_plus_the_lever():
    base = cell_run(levers.LAG_BASE_CELL, 3, "R", 200)[1]
    for k in levers.LAGS:
        out, argv, steps = row_run(f"lag{k}", 3, "R")
        assert diff(base, argv) == {"--rollout-lag"} and flag_dict(argv)["--rollout-lag"] == str(k) and steps == 200
    out, argv, steps = row_run("qwen3-ratio-fp4", 3, "R")
    assert diff(base, argv) == {"--preset", "--rollout-dtype"} and steps == design.AFTER_STEPS
    assert flag_dict(argv)["--preset"] == "qwen3-ratio" and flag_dict(argv)["--old-logp"] == "engine"
    assert lowbit_spec("toy-int4") == Spec("toy-int4", "cipher:32-32", "int4", None, preset="toy")
    rows = regime_rows(levers.LAG_BASE_CELL, 0)  # the committed K = 0 records: flags checked against cell_run
    w = lag_window(rows)
    assert w["readings"] == 15 and 0 < w["token_flip_rate"] < 1 and w["lag_logged"] == [None]
    with pytest.raises(InputError):
        row_run("lag3", 0, "R")


def test_lag_choice_rule():
    target = 0.8
    lag = {f"lag{k}": {"token_flip_rate": {"mean": v, "n": 8}} for k, v in zip(levers.LAGS, (0.1, 0.3, 0.5, 0.7))}
    assert lag_choice(lag, target) == 8
    lag["lag4"]["token_flip_rate"]["mean"] = 0.9  # as near as K = 8 (0.1 away): the smaller K
    assert lag_choice(lag, target) == 4
    assert lag_choice({**lag, "lag2": {"token_flip_rate": {"mean": 0.3, "n": 7}}}, target) is None  # a seed missing
    assert lag_choice(lag, None) is None
    assert lag_choice({k: {"token_flip_rate": {"mean": 0.95, "n": 8}} for k in lag}, 0.2) == 1  # K* = 1


def test_fallback_rule():
    ok = [dict(reached=True, steps=120, probe_reward=0.31)] * 8
    start, after = dict(mean=0.31, n=8), dict(mean=0.8, n=8)
    assert int4_preset(ok, start, after)[0] == "qwen3-ratio"
    assert int4_preset(ok[:7] + [dict(reached=False)], start, after)[0] == "toy"
    assert int4_preset(ok, start, dict(mean=0.35, n=8))[0] == "toy"  # it does not learn the cipher in 200 steps
    assert int4_preset(ok[:7] + [None], start, after)[0] is None
    assert int4_preset(ok, start, dict(mean=0.8, n=5))[0] is None
    with pytest.raises(InputError, match="rules decided"):
        plan(dict(k_star=8, int4_preset=None), "R", levers.GRID_SEEDS)
    assert decided(dict(k_star=2, int4_preset="toy")) == (2, "toy")


def entry(collapse_steps, areas):
    return cell_entry({s: dict(collapse_step=c, heldout_area=a, max_drawdown=0.0, best_heldout=a, final_heldout=a)
                       for s, c, a in zip(levers.GRID_SEEDS, collapse_steps, areas)})


def test_tests_families_and_the_extension_rule():
    held, flat = [None] * 8, [0.5] * 8
    cells = {"lag1-clip/none/n4": entry(held, flat), "lag1-clip/r3/n4": entry(held, flat),
             "lag1-clip/tis/n4": entry(held, flat),
             "toy-int4-clip/none/n4": entry([400, 500] + [None] * 6, flat),
             **{f"toy-int4-clip/{a}/n4": entry(held, flat) for a in ("r3", "tis", "r3-tis")}}
    ts = grid_tests(cells)
    assert {(t["family"], t["a"], t["b"]) for t in ts if t["metric"] == "collapsed"} == {
        ("A", "lag1-clip/none/n4", "lag1-clip/r3/n4"), ("A", "toy-int4-clip/none/n4", "toy-int4-clip/r3/n4"),
        ("B", "lag1-clip/none/n4", "lag1-clip/tis/n4"), ("B", "lag1-clip/tis/n4", "lag1-clip/r3/n4"),
        ("B", "toy-int4-clip/none/n4", "toy-int4-clip/tis/n4"), ("B", "toy-int4-clip/tis/n4", "toy-int4-clip/r3/n4"),
        ("B", "toy-int4-clip/r3/n4", "toy-int4-clip/r3-tis/n4"),
        ("B", "toy-int4-clip/none/n4", "toy-int4-clip/r3-tis/n4")}
    assert all("p_holm" in t for t in ts) and not any(t["r3_holds"] for t in ts)  # 2 of 8 vs 0 of 8: p 0.47
    assert extended(cells) == ["toy-int4-clip"]  # two more falls: it separates; lag1 does not
    cells["lag1-clip/r3/n4"] = entry(held, [0.9, 0.8, 0.9, 0.85, 0.95, 0.9, 0.8, 0.9])  # r3 learns more on every seed
    assert extended(cells) == ["lag1-clip", "toy-int4-clip"]
    del cells["toy-int4-clip/tis/n4"]["runs"][35]
    assert extended(cells) == ["lag1-clip"]  # not every run of the setting has finished seeds 32-39


def test_the_grid_report_is_partial_until_every_planned_run_and_marks_each_clause(tmp_path):
    rows = dict(k_star=8, int4_preset="qwen3-ratio", int4_why="the rule")
    held, flat = [None] * 8, [0.5] * 8
    cells = {c: entry(held, flat) for c in levers.grid_cells(8, "qwen3-ratio")}
    int4 = "qwen3-ratio-int4-clip"
    cells[f"{int4}/none/n4"] = entry([300, 400, 500] + [None] * 5, flat)  # 3 of 8 against 0: the extension runs
    del cells["lag8-clip/tis/n4"]["runs"][39]
    cells["lag8-clip/tis/n4"] = cell_entry(cells["lag8-clip/tis/n4"]["runs"])
    data = write_grid(str(tmp_path), cells, rows, 0.0)
    md = (tmp_path / "grid.md").read_text()
    assert not data["complete"] and "**partial: 79 of 112 planned runs finished**" in md  # int4 extends already
    assert {v for _, v in data["verdicts"]["lagK"]} == {"pending"}  # seed 39 of one of its cells is missing
    assert dict(data["verdicts"]["lag1"]) == {"each arm 0-1 falls of 8": "confirmed", "nothing separates": "confirmed"}
    assert dict(data["verdicts"]["int4"])["r3-tis fewest"] == "pending"  # its setting runs seeds 40-47 first
    cells["lag8-clip/tis/n4"] = entry(held, flat)
    data = write_grid(str(tmp_path), cells, rows, 0.0)
    md = (tmp_path / "grid.md").read_text()
    assert data["extended"] == [int4] and "**partial: 80 of 112 planned runs finished**" in md  # 4 cells x 40-47
    v = {name: dict(cl) for name, cl in data["verdicts"].items()}
    assert v["int4"]["no replay falls on 2-4 of 8"] == "confirmed" and v["lag1"]["each arm 0-1 falls of 8"] == \
        "confirmed" and v["lagK"]["no replay falls on 1-3 of 8"] == "refuted"  # lag 8's no replay never fell
    assert v["int4"]["the extension rule runs seeds 40-47"] == "confirmed" and v["int4"]["r3-tis fewest"] == "pending"
    assert "3 of 8 [14%, 69%]" in md and "  - TIS falls least: **refuted**" in md  # all at 0: not 'least'
    for c in levers.lowbit_cells("qwen3-ratio"):  # the extension's seeds 40-47: no replay falls on 4 more
        more = {s: dict(collapse_step=300 if c.endswith("/none/n4") and s < 44 else None, heldout_area=0.5,
                        max_drawdown=0.0, best_heldout=0.5, final_heldout=0.5) for s in levers.EXTRA_SEEDS}
        cells[c] = cell_entry({**cells[c]["runs"], **more})
    data = write_grid(str(tmp_path), cells, rows, 0.0)
    assert data["complete"] and "(pre-registered in experiments/regime/levers.py; complete)" in \
        (tmp_path / "grid.md").read_text()
    v = {name: dict(cl) for name, cl in data["verdicts"].items()}
    assert v["int4"]["r3-tis fewest"] == "confirmed"  # 0 of 16: none fall less, no replay falls more (ties allowed)
    assert v["int4"]["at 8 seeds no Holm-adjusted p below 0.05"] == "confirmed"  # 3 of 8 vs 0 of 8
    sep = [t for t in data["tests"] if t["a"] == f"{int4}/none/n4" and t["metric"] == "collapsed"]
    assert sep and min(t["p_holm"] for t in sep) < 0.05  # 7 of 16 against 0 of 16 does separate, over 16 seeds
    runs = dict(cells[f"{int4}/r3-tis/n4"]["runs"])
    runs[45] = dict(runs[45], collapse_step=600)
    cells[f"{int4}/r3-tis/n4"] = cell_entry(runs)
    v = {name: dict(cl) for name, cl in write_grid(str(tmp_path), cells, rows, 0.0)["verdicts"].items()}
    assert v["int4"]["r3-tis fewest"] == "refuted"  # 1 of 16, where r3 and tis fell on none


def test_the_extension_waits_for_every_planned_cell():
    held, flat = [None] * 8, [0.5] * 8
    planned = levers.lowbit_cells("toy")
    cells = {c: entry(held, flat) for c in planned[1:]}
    cells["toy-int4-clip/r3/n4"] = entry([100, 200, 300] + [None] * 5, flat)
    assert extended(cells) == ["toy-int4-clip"]  # what has run separates
    assert extended(cells, planned_cells=planned) == []  # but no replay's cell has not started


TINY = ["--steps", "4", "--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task", "sort:3-4",
        "--val-every", "2", "--val-prompts", "2", "--no-plot", "--quiet", "--lr", "3e-3", "--mismatch-every", "1",
        "--rollout-dtype", "fp8-router", "--rollout-lag", "2"]


def test_a_lag_row_is_measured_end_to_end_with_the_lagged_engine(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, "--out", "run"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    run_dir, spec = str(tmp_path / "run"), Spec("tiny", "sort:3-4", "fp8-router", None)
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    w = lag_window(rows, window=(0, 3))
    assert w["readings"] == 4 and w["lag_logged"] == [0, 1, 2] and 0 <= w["token_flip_rate"] <= 1
    probe = lag_probe(run_dir, 2, spec, step=4, prompts=4, samples=2)
    assert probe["engine_step"] == 2 and probe["kl_r3"] is not None and probe["tokens"] > 0
    from experiments.regime.measure import step_model
    fresh = measure(step_model(run_dir, spec, 4), make_task("sort:3-4"), spec, prompts=4, samples=2)  # K = 0's engine
    assert fresh["kl"] != probe["kl"]
    with pytest.raises(InputError, match="rollout-lag 1"):
        lag_probe(run_dir, 1, spec, step=4, prompts=4, samples=2)
    res = lag_result(rows, probe)
    assert res["probe_kl_r3"] == probe["kl_r3"] and res["collapse_step"] is None


@pytest.mark.parametrize("row", ["toy-int4", "qwen3-ratio-int4"])
def test_a_low_bit_row_is_measured_end_to_end(row):
    spec = lowbit_spec(row)
    task = make_task(spec.task)
    model = build_model(preset_config(spec.preset, task), 0)
    m = measure(model, task, spec, prompts=4, samples=2)
    assert m["router_flip_rate"] > 0 and m["kl"] > 0 and m["kl_r3"] is not None
    assert m["exposure"] == pytest.approx(m["response_length"] * m["kl"])


def test_k0_is_read_from_the_regime_grids_records_and_its_after_200_probe():
    res = _job("lag", "lag0", 0, {})
    with open(os.path.join(ROOT, "results", "regime", "measure", "after-natural-s0.json")) as f:
        after = json.load(f)
    assert res["probe_kl_r3"] == after["kl_r3"] and res["readings"] == 15 and res["collapse_step"] is None


def fake(kind, row, seed, **values):
    return f"{kind}-{row}-s{seed}", dict(values, provenance=dict(commit="0123456789abcdef"))


def test_the_report_marks_partial_and_pending_rows(tmp_path):
    out = tmp_path / "levers"
    files = {}
    for s in design.SEEDS:
        files.update([fake("start", "qwen3-ratio-int4", s, token_flip_rate=0.8, kl=4e-3, kl_r3=3e-3, reward=0.31,
                           warmup=dict(reached=True, steps=150, probe_reward=0.31)),
                      fake("after", "qwen3-ratio-int4", s, token_flip_rate=0.78, reward=0.85 + 0.01 * s)])
        for i, row in enumerate(("lag0", "lag1", "lag2", "lag4", "lag8", "lv3")):
            files.update([fake("lag", row, s, token_flip_rate=(0.08, 0.2, 0.35, 0.55, 0.7, 0.82)[i] + 0.001 * s,
                               kl=1e-3, collapse_step=None)])
    for s in (0, 1, 2):
        files.update([fake("start", "toy-int4", s, token_flip_rate=0.15, reward=0.3, warmup=dict(reached=True))])
    (out / "measure").mkdir(parents=True)
    for key, value in files.items():
        atomic_write_json(str(out / "measure" / f"{key}.json"), value)
    data = rows_data(str(out), design.SEEDS)
    assert data["k_star"] == 8 and data["int4_preset"] == "qwen3-ratio" and not data["complete"]
    assert data["lowbit"]["toy-int4"]["n"] == dict(start=3, after=0)
    write_rows(str(out), data)
    md = (out / "rows.md").read_text()
    assert "(**partial**" in md and "toy-int4 (partial: 3 of 8)" in md and "toy-fp4 (pending)" in md
    assert "**K* = 8**" in md and "dial: natural" in md and "K = 8" in md and "paper (Qwen3-30B-A3B)" in md
    assert json.loads((out / "rows.json").read_text())["lag"]["lag8"]["n"] == 8
    assert (out / "rows.png").stat().st_size > 10_000 and "![the levers in the regime table](rows.png)" in md
    assert list(data["dial_line"]) == list(design.POSITIONS)  # the whole dial, from the committed regime table
    assert data["design_commit"] and f"added at commit {data['design_commit'][:10]}" in md  # the pre-registration
    assert data["made_at"] == ["0123456789"] and "the measurements here ran at 0123456789)" in md
    # the quick check's way: the same measurements read from their folder, the tables written elsewhere
    assert rows_data(str(tmp_path / "elsewhere"), design.SEEDS, measured=str(out)) == data


def test_the_command_line_keeps_the_seeds_apart():
    from experiments.regime.__main__ import parse_args
    a = parse_args(["--levers"])
    assert a.seeds == list(design.SEEDS) and a.out == os.path.join("results", "regime", "levers")
    assert parse_args(["--levers", "--grid"]).seeds is None
    assert parse_args(["--levers", "--report", "--measured", "M"]).measured == "M"
    assert parse_args(["--levers", "--grid", "--report", "--measured", "M"]).measured == "M"
    for argv in (["--levers", "--grid", "--seeds", "3"], ["--levers", "--seeds", "32"], ["--levers", "--confirm"],
                 ["--levers", "--measured", "M"], ["--report", "--measured", "M"],
                 ["--levers", "--grid", "--measured", "M"]):
        with pytest.raises(SystemExit):
            parse_args(argv)


def test_rows_are_measured_row_by_row_so_a_stopped_command_keeps_every_finished_row(tmp_path, monkeypatch):
    """make_rows runs a row's missing runs, then measures them, before the next row's runs start; a measured seed is
    neither rerun nor measured again (stand-ins for the runs and the measurements: only the order is under test)."""
    from experiments.regime import levers_measure as M
    log = []

    def fake_measure_all(out, jobs, workers, job=None):
        res = {}
        for kind, name, seed, _ in jobs:
            path = os.path.join(out, "measure", f"{kind}-{name}-s{seed}.json")
            if not os.path.exists(path):
                log.append(("measure", kind, name, seed))
                atomic_write_json(path, {"kl": 0.0})
            res[f"{kind}-{name}-s{seed}"] = {"kl": 0.0}
        return res

    monkeypatch.setattr(M, "measure_all", fake_measure_all)
    monkeypatch.setattr(M, "run_all", lambda runs, **kw: log.extend(("run", os.path.basename(r[0])) for r in runs))
    monkeypatch.setattr(M, "write_record", lambda run_dir, records: None)
    os.makedirs(tmp_path / "measure")
    atomic_write_json(str(tmp_path / "measure" / "lag-lag2-s1.json"), {"kl": 0.0})  # made before: kept
    M.make_rows(str(tmp_path), str(tmp_path / "runs"), [0, 1], jobs=1)
    rows = [*levers.LAG_ROWS, *levers.LOWBIT_ROWS]
    made = [e for e in log if e[0] == "measure" and e[1] in ("lag", "after") and e[2] in rows]
    runs = [e[1] for e in log if e[0] == "run"]
    assert ("lag-lag2-s1" not in {f"{e[1]}-{e[2]}-s{e[3]}" for e in made}) and "lag2-none-n4-s1" not in runs
    assert len(made) == 2 * len(rows) - 1 and len(runs) == len(made)
    for i, row in enumerate(rows):  # every run of row i comes after row i-1's measurements and before row i's
        first_run = min(j for j, e in enumerate(log) if e[0] == "run" and e[1].startswith(f"{row}-none-n4-"))
        first_measure = min(j for j, e in enumerate(log) if e[0] == "measure" and e[1] != "start" and e[2] == row)
        last_run = max(j for j, e in enumerate(log) if e[0] == "run" and e[1].startswith(f"{row}-none-n4-"))
        assert last_run < first_measure
        if i:
            assert first_run > max(j for j, e in enumerate(log) if e[0] == "measure" and e[1] != "start"
                                   and e[2] == rows[i - 1])


def test_the_grid_report_reads_the_rules_from_measured_rows_and_writes_elsewhere(tmp_path):
    """`--levers --grid --report --measured DIR --out ELSEWHERE`: K* and the int4 preset come from DIR's committed
    rows (8 and qwen3-ratio), the grid's tables and figure are written to ELSEWHERE (what a reproduce check needs)
    from the records there are (one, a round-5 record relabelled as lag1-clip/none/n4 seed 32: its flags are the
    grid run's); without the rows' measurements the report is refused in one line, exit 1, naming the command that
    makes them."""
    import gzip

    from experiments.regime.__main__ import main
    from experiments.sweep import read_record, record_path
    out, records = tmp_path / "out", tmp_path / "records"
    measured = os.path.join(ROOT, "results", "regime", "levers")
    argv = ["--levers", "--grid", "--report", "--measured", measured, "--records", str(records), "--out", str(out)]
    data = main(argv)
    assert (data["k_star"], data["int4_preset"], data["runs"], data["planned"], data["complete"]) == \
        (8, "qwen3-ratio", 0, 80, False)
    assert "**partial: 0 of 80 planned runs finished**" in (out / "grid.md").read_text()
    head, rows = read_record(os.path.join(ROOT, "results", "regime", "confirm", "records",
                                          "lv3-clip-none-n4-s8.jsonl.gz"))
    run_dir, flags, _ = grid_run("lag1-clip/none/n4", 32, str(out / "runs"))  # the default --runs-dir
    records.mkdir()
    head = dict(head, flags=[*flags, "--steps", "800"], cpu="A CPU [x]")  # the grid run's flags, a CPU named
    with gzip.open(record_path(run_dir, str(records)), "wt") as f:
        f.write("\n".join(json.dumps(x) for x in [head, *rows]) + "\n")
    data = main(argv)
    assert data["runs"] == 1 and list(data["cells"]) == ["lag1-clip/none/n4"] and (out / "grid.png").stat().st_size
    assert "**partial: 1 of 80 planned runs finished**" in (out / "grid.md").read_text()
    assert "](grid.png)" in (out / "grid.md").read_text()
    assert data["made_on"] == {"lag1-clip/none/n4": {"A CPU [x]": [32]}}  # the header's CPU
    assert "- lag1-clip/none/n4: seed 32 on A CPU [x]" in (out / "grid.md").read_text()
    r = subprocess.run([sys.executable, "-m", "experiments.regime", "--levers", "--grid", "--report", "--records",
                        str(records), "--out", str(tmp_path / "bare")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "python -m experiments.regime --levers" in r.stderr
