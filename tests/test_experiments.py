"""What this proves: the collapse protocol runs every (arm, seed) of none / r3 / oracle with identical flags but
--replay and --rollout-dtype, prints its pre-registered rule, writes its table (held-out accuracy and fidelity
columns, provenance line), JSON (runs keyed ARM-sSEED with collapse_step) and figure, resumes (finished runs are
skipped), refuses to reuse a run folder made with other flags, draws the phase diagram, and applies the rule."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ("--task sort:3-4 --warmup-steps 3 --prompts-per-step 3 --group-size 2 --val-every 0")


ENV = dict(os.environ, PYTHONPATH=ROOT)  # the sweep runs from its own folder; `pip install -e .` does the same


def collapse(tmp_path, *extra):
    cmd = [sys.executable, "-m", "experiments.collapse", "--setting", "headline", "--seeds", "0", "1", "--steps",
           "3", "--common", TINY, "--runs-dir", "runs", "--out", "out", *extra]  # extra's --setting wins
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=400, env=ENV)


def test_collapse_sweep_writes_table_and_resumes(tmp_path):
    r = collapse(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "collapse.json").read_text())
    assert sorted(data["runs"]) == ["none-s0", "none-s1", "oracle-s0", "oracle-s1", "r3-s0", "r3-s1"]
    assert all(0 <= m["heldout_accuracy"] <= 1 and "collapse_step" in m for m in data["runs"].values())
    assert "collapse rule (pre-registered)" in r.stdout and data["rule"]["reward_drop"] == 0.3
    assert {"commit", "dirty", "torch", "command"} <= set(data["provenance"])
    md = (tmp_path / "out" / "collapse.md").read_text()
    assert "held-out acc" in md and "torch" in md.splitlines()[-1]
    assert (tmp_path / "out" / "collapse.png").stat().st_size > 10_000
    assert "| none | 0 |" in r.stdout and "| r3 | 1 |" in r.stdout and "| oracle | 1 |" in r.stdout
    base = json.loads((tmp_path / "runs" / "none-fp8-router-s0" / "sweep_flags.json").read_text())
    for run in ("r3-fp8-router-s0", "oracle-fp32-s0"):  # the arms differ only in --replay / --rollout-dtype
        flags = json.loads((tmp_path / "runs" / run / "sweep_flags.json").read_text())
        diff = [(a, b) for a, b in zip(flags, base) if a != b]
        assert len(flags) == len(base) and {b for _, b in diff} <= {"none", "fp8-router"}, diff
    r = collapse(tmp_path)
    assert r.returncode == 0 and "6 of 6 runs already finished" in r.stdout
    r = subprocess.run([*r.args[:r.args.index("--steps") + 1], "4", *r.args[r.args.index("--steps") + 2:]],
                       cwd=tmp_path, capture_output=True, text=True, timeout=400, env=ENV)  # a longer horizon
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(len(open(tmp_path / "runs" / d / "metrics.jsonl").readlines()) == 4
               for d in os.listdir(tmp_path / "runs") if d != "logs")
    r = subprocess.run([sys.executable, "-m", "experiments.collapse", "--setting", "headline", "--seeds", "0",
                        "--steps", "3", "--common", TINY + " --lr 1e-2", "--runs-dir", "runs", "--out", "out"],
                       cwd=tmp_path,
                       capture_output=True, text=True, timeout=400, env=ENV)
    assert r.returncode != 0 and "different flags" in r.stderr


def test_phase_diagram_and_rule(tmp_path):
    r = collapse(tmp_path, "--phase", "--phase-lrs", "1e-3", "--phase-dtypes", "bf16", "fp8",
                 "--phase-seeds", "0", "--seeds", "0", "--phase-steps", "3")  # the headline's horizon: runs shared
    assert r.returncode == 0, r.stderr[-3000:]
    cells = json.loads((tmp_path / "out" / "phase.json").read_text())["cells"]
    assert len(cells) == 1 * 2 * 3 and all(0 <= c["collapse_rate"] <= 1 for c in cells.values())
    assert (tmp_path / "out" / "phase.png").stat().st_size > 10_000
    runs = os.listdir(tmp_path / "runs")  # the oracle is shared across precision columns
    assert sum(x.startswith("oracle") for x in runs) == 1 + 1  # the headline run + one per lr


def test_collapse_rule():
    from experiments.rules import collapse_step
    row = lambda s, rew, **kw: dict(step=s, reward=rew, loss=0.0, grad_norm=1.0, **kw)  # noqa: E731
    assert collapse_step([row(s, 0.8) for s in range(50)]) == (None, None)
    steps = [row(s, 0.8) for s in range(20)] + [row(s, 0.0) for s in range(20, 60)]
    step, why = collapse_step(steps)
    assert why == "reward_drop" and 20 < step < 30
    evals = [row(0, 0.5, **{"eval/accuracy": 0.9}), row(1, 0.5, **{"eval/accuracy": 0.55})]
    assert collapse_step(evals) == (1, "heldout_drop")
    assert collapse_step([row(0, 0.5), dict(row(1, 0.5), grad_norm=float("nan"))]) == (1, "nonfinite")


def test_fidelity_without_a_direction_is_none_and_skipped():
    import torch
    from experiments.collapse.protocol import fidelity_points
    from r3.train.fidelity import _cos
    assert _cos(torch.zeros(3), torch.ones(3)) is None and abs(_cos(torch.ones(3), torch.ones(3)) - 1) < 1e-12
    rows = [{"fidelity/cos": 0.9, "fidelity/rel_err": 0.4, "fidelity/grad_norm": 2.0},
            {"fidelity/cos": None, "fidelity/rel_err": None, "fidelity/grad_norm": 2.0},  # logged since the fix
            {"fidelity/cos": 0.0, "fidelity/rel_err": 2e28, "fidelity/grad_norm": 2.0},  # g_on = 0, logged before it
            {"fidelity/cos": 0.0, "fidelity/rel_err": 0.0, "fidelity/grad_norm": 0.0}, {}]  # g_arm = 0; no measure
    assert fidelity_points(rows) == rows[:1]


def test_regime_setting_runs_are_the_regime_grids_own():
    """At a regime setting the protocol's arms are the regime grid's (and round 5's) runs for the same seed, flag for
    flag; none and r3 differ in --replay only, the oracle in its engine (fp32, no dial)."""
    from experiments.collapse.protocol import REGIME_COMMON, REGIME_STEPS, regime_run
    from experiments.regime import confirm, design
    from experiments.regime.grid import cell_run
    assert REGIME_COMMON == design.COMMON and REGIME_STEPS == confirm.STEPS
    from experiments.collapse.protocol import parse_args
    a, h = parse_args(["--setting", "lv3-clip"]), parse_args(["--setting", "headline"])
    assert (a.out, a.steps, a.common) == (os.path.join("results", "collapse", "lv3-clip"), 800, design.COMMON)
    assert (h.out, h.steps, h.rollout_dtype) == (os.path.join("results", "collapse"), 400, "fp8-router")  # its own
    from experiments.sweep import flag_dict
    for setting in ("lv3", "lv3-clip"):
        for arm in ("none", "r3"):
            assert regime_run(setting, arm, 11, REGIME_COMMON, "R") == cell_run(f"{setting}/{arm}/n4", 11, "R", 800)[:2]
        variant = "-clip" if setting.endswith("-clip") else ""
        assert regime_run(setting, "oracle", 11, REGIME_COMMON, "R") == \
            cell_run(f"oracle{variant}/none/n4", 11, "R", 800)[:2]
        none, r3, oracle = (flag_dict(regime_run(setting, a, 11, REGIME_COMMON, "R")[1])
                            for a in ("none", "r3", "oracle"))
        assert {k for k in none if none[k] != r3.get(k)} == {"--replay"} and set(none) == set(r3)
        assert none["--router-levels"] == "3" and "--router-levels" not in oracle
        assert oracle["--rollout-dtype"] == "fp32" and oracle["--replay"] == "none"
        assert {k for k in oracle if k in none and oracle[k] != none[k]} == {"--rollout-dtype"}
        assert (none["--clip-low"] == "0.2") == setting.endswith("-clip") == (oracle["--clip-low"] == "0.2")


def test_default_setting_is_the_one_round_5_confirmed():
    """python -m experiments.collapse runs round 5's confirmed setting by default (the most separating one, by its
    Holm p) once the confirmation is complete, and the headline setting while it is partial or confirmed nowhere."""
    from experiments.collapse.protocol import DEFAULT_SETTING
    c = json.loads(open(os.path.join(ROOT, "results", "regime", "confirm", "confirm.json")).read())["confirmation"]
    confirmed = sorted((r["p_holm"], r["setting"]) for r in c["rows"] if r["confirmed"]) if c["complete"] else []
    assert DEFAULT_SETTING == (confirmed[0][1] if confirmed else "headline"), (DEFAULT_SETTING, confirmed)


def test_regime_setting_runs_with_its_rule_and_refuses_what_it_fixes(tmp_path):
    r = collapse(tmp_path, "--setting", "lv3", "--seeds", "0", "--arms", "none", "r3")
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "collapse.json").read_text())
    from experiments.rules import RULE
    assert data["setting"] == "lv3" and data["rule"] == RULE and sorted(data["runs"]) == ["none-s0", "r3-s0"]
    assert "setting: lv3; collapse rule (pre-registered): sustained collapse" in r.stdout
    flags = json.loads((tmp_path / "runs" / "lv3-r3-n4-s0" / "sweep_flags.json").read_text())
    assert flags[flags.index("--router-levels") + 1] == "3" and flags[flags.index("--mini-steps") + 1] == "4"
    for extra, says in ((("--phase",), "--phase varies the headline setting"),
                        (("--rollout-dtype", "bf16"), "--rollout-dtype belongs to --setting headline")):
        r = collapse(tmp_path, "--setting", "lv3", *extra)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
