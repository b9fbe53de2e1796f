"""What this proves: the collapse sweep runs every (arm, seed) with identical flags but --replay, writes its table
(with a held-out accuracy column and the provenance line), JSON and figure, resumes (finished runs are skipped),
and refuses to reuse a run folder made with other flags."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ("--task sort:3-4 --warmup-steps 3 --prompts-per-step 3 --group-size 2 --val-every 0")


ENV = dict(os.environ, PYTHONPATH=ROOT)  # the sweep runs from its own folder; `pip install -e .` does the same


def collapse(tmp_path, *extra):
    cmd = [sys.executable, "-m", "experiments.collapse", "--seeds", "0", "1", "--steps", "3",
           "--common", TINY, "--runs-dir", "runs", "--out", "out", *extra]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=400, env=ENV)


def test_collapse_sweep_writes_table_and_resumes(tmp_path):
    r = collapse(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "collapse.json").read_text())
    assert sorted(data["runs"]) == ["none-s0", "none-s1", "r3-s0", "r3-s1"]
    assert all(0 <= m["heldout_accuracy"] <= 1 for m in data["runs"].values())  # the held-out column
    assert {"commit", "dirty", "torch", "command"} <= set(data["provenance"])
    md = (tmp_path / "out" / "collapse.md").read_text()
    assert "held-out acc" in md and "torch" in md.splitlines()[-1]
    assert (tmp_path / "out" / "collapse.png").stat().st_size > 10_000
    assert "| none | 0 |" in r.stdout and "| r3 | 1 |" in r.stdout
    for arm in ("none", "r3"):  # the arms differ only in --replay
        flags = json.loads((tmp_path / "runs" / f"fp8-grpo-none-{arm}-m4-s0" / "sweep_flags.json").read_text())
        other = json.loads((tmp_path / "runs" / "fp8-grpo-none-none-m4-s0" / "sweep_flags.json").read_text())
        i = flags.index("--replay")
        assert flags[:i] + flags[i + 2:] == other[:i] + other[i + 2:]
    r = collapse(tmp_path)
    assert r.returncode == 0 and "4 of 4 runs already finished" in r.stdout
    r = subprocess.run([sys.executable, "-m", "experiments.collapse", "--seeds", "0", "--steps",
                        "3", "--common", TINY + " --lr 1e-2", "--runs-dir", "runs", "--out", "out"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=400, env=ENV)
    assert r.returncode != 0 and "different flags" in r.stderr
