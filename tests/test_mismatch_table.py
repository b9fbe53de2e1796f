"""What this proves: the mismatch-table script runs end to end on tiny settings and writes a table, JSON and PNG
with dense / MoE / MoE + R3 rows, R3 reporting the trainer's own (normal-forward) flips."""
import json
import os

import torch

from experiments.mismatch.table import main


def test_mismatch_table_smoke(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        report = main(["--prompts", "4", "--samples", "2", "--warmup-steps", "2", "--dtypes", "bf16", "fp8",
                       "--task", "sort:3-5", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    md = capsys.readouterr().out
    assert "| MoE + R3 |" in md and "*paper: MoE*" in md and "wall time" in md
    assert os.path.getsize(tmp_path / "mismatch_table.png") > 0
    saved = json.load(open(tmp_path / "mismatch_table.json"))
    assert saved["results"] == json.loads(json.dumps(report["results"]))
    rows = {(r["dtype"], r["row"]): r for r in saved["results"]}
    assert len(rows) == 6
    for d in ("bf16", "fp8"):
        assert rows[(d, "dense")]["router_flip_rate"] is None
        assert rows[(d, "MoE + R3")]["router_flip_rate"] == rows[(d, "MoE")]["router_flip_rate"]
        assert all(rows[(d, r)]["kl"] >= 0 and rows[(d, r)]["n_tokens"] > 0 for r in ("dense", "MoE", "MoE + R3"))
