"""What this proves: experiments/speed/ runs end to end at CI size and writes its JSON and markdown table, with
every section present, ratios computed, and our model and transformers' loaded with the same weights; the compile
probe's opaque op is grouped_mm exactly."""
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_speed_quick_writes_json_and_table(tmp_path):
    out = tmp_path / "speed.json"
    r = subprocess.run([sys.executable, "-m", "experiments.speed", "--quick", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    for section in ("moe", "train", "generate", "scaling"):
        assert res[section] and all(v == v and v > 0 for row in res[section] for k, v in row.items()
                                    if k.endswith(("_ms", "_tok_s", "ratio", "speedup")))
    # parity in fp32: the block's weights are std 0.02, so its outputs are ~4e-3 and 1e-7 is ~2.5e-5 of them
    assert all(r["max_abs_diff"] < 1e-7 for r in res["moe"] if r["dtype"] == "fp32")
    assert all(r["fp32_logit_max_abs_diff"] < 1e-5 for r in res["train"])
    md = (tmp_path / "speed.md").read_text()
    assert "ours / tf" in md and "experiments.speed --quick" in md


def test_decode_section_times_old_and_new_kernels(tmp_path):
    out = tmp_path / "decode.json"
    r = subprocess.run([sys.executable, "-m", "experiments.speed", "--quick", "--sections", "decode", "--out",
                        str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(out.read_text())["decode"]
    assert row["old_ms"] > 0 and row["new_ms"] > 0 and math.isclose(row["speedup"], row["old_ms"] / row["new_ms"])
    assert "old kernels vs new" in (tmp_path / "decode.md").read_text()


def test_opaque_grouped_mm_matches_grouped_mm_forward_and_backward():
    """The compile probe's opaque op is F.grouped_mm and its autograd, bit for bit, an empty expert included."""
    import torch
    import torch.nn.functional as F
    import r3.model.moe
    from experiments.speed.bench import opaque_experts, opaque_grouped_mm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(23, 16, generator=g, requires_grad=True)
    w = torch.randn(4, 8, 16, generator=g, requires_grad=True)
    offs = torch.tensor([5, 5, 17, 23], dtype=torch.int32)  # expert 1 gets no rows
    up = torch.randn(23, 8, generator=g)
    want = F.grouped_mm(x, w.mT, offs=offs)
    got = opaque_grouped_mm(x, w, offs)
    assert torch.equal(got, want)
    for a, b in zip(torch.autograd.grad((got * up).sum(), (x, w)), torch.autograd.grad((want * up).sum(), (x, w))):
        assert torch.equal(a, b)
    saved = r3.model.moe._grouped_mm, r3.model.moe._grouped_mm_ok
    with opaque_experts():
        assert r3.model.moe._grouped_mm is opaque_grouped_mm and r3.model.moe._grouped_mm_ok(x, w)
        assert not r3.model.moe._grouped_mm_ok(x, torch.randn(4, 8, 6))  # 24-byte rows: grouped_mm refuses them
    assert (r3.model.moe._grouped_mm, r3.model.moe._grouped_mm_ok) == saved


def test_compile_section_compiles_the_trainer_step(tmp_path):
    """CI size (one layer, 2 x 8 tokens): as the code stands the fp32 expert path breaks the graph; with the opaque op the forward is one
    graph; both compiled gradients equal eager's to fp32 rounding."""
    out = tmp_path / "compile.json"
    r = subprocess.run([sys.executable, "-m", "experiments.speed", "--quick", "--sections", "compile", "--out",
                        str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-3000:]
    eager, as_is, opaque = json.loads(out.read_text())["compile"]
    assert (eager["arm"], eager["graphs"], eager["speedup"]) == ("eager", None, 1.0)
    assert as_is["graphs"] > 1 and opaque["graphs"] == 1
    for row in (as_is, opaque):
        assert row["first_call_s"] > 0 and row["ms"] > 0 and math.isclose(row["speedup"], eager["ms"] / row["ms"])
        assert row["grad_max_abs_diff"] < 1e-5 * row["grad_max_abs"]
    md = (tmp_path / "compile.md").read_text()
    assert "torch.compile probe" in md and "a 1-layer toy" in md  # the tests' size, said in its table
