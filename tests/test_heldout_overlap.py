"""What this proves: experiments.heldout_overlap replays the warm-up's draws and finds the known flaw it documents
(the warm-up at init seed 0 trains on every held-out cipher prompt, at seed 1 on none), and scores a warm-up model
on the held-out set and on a disjoint set of other eval-split prompts."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_seed_0_warmup_sees_the_heldout_set(tmp_path):
    out = tmp_path / "ho.json"
    r = subprocess.run([sys.executable, "-m", "experiments.heldout_overlap", "--warmup-steps", "8", "--eval-prompts",
                        "4", "--seeds", "0", "1", "--score-seeds", "1", "--count-task", "chain:16",
                        "--count-warmup-steps", "2", "--out", str(out)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    seen = {(c["task"], c["seed"]): c["seen"] for c in res["counts"]}
    assert seen[("cipher:32-32", 0)] == 4 and seen[("cipher:32-32", 1)] == 0  # 64^32 prompts: no chance overlap
    assert {c["heldout"] for c in res["counts"] if c["task"] == "chain:16"} == {3}  # 3 of chain's 64 starts
    sets = {s["set"]: s for s in res["scores"]}
    assert set(sets) == {"heldout", "other"} and all(s["seed"] == 1 and s["prompts"] == 4 for s in sets.values())
    assert all(0 <= s[k] <= 1 for s in sets.values() for k in ("accuracy_greedy", "reward_greedy", "reward"))
    assert "seen by the warm-up" in (tmp_path / "ho.md").read_text()
