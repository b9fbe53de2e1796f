"""What this proves: `python -m r3.plots RUN_A RUN_B` overlays two short train.py runs with the differing flag in the
legend; plot_run draws held-out accuracy panels; importing r3.plots does not import matplotlib; --tensorboard fails
with a clear message when tensorboard is missing."""
import os
import subprocess
import sys

import pytest

from r3.runs.plots import compare_runs, differing_flags, main, plot_run, run_labels, tensorboard_writer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--warmup-steps", "2", "--task", "sort:3-4",
        "--val-every", "0", "--no-plot", "--quiet"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    for replay in ("none", "r3"):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, "--replay", replay, "--out",
                            f"run_{replay}"], cwd=d, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 0, r.stderr[-3000:]
    return [str(d / "run_none"), str(d / "run_r3")]


def test_compare_two_runs(two_runs, tmp_path):
    assert run_labels(two_runs) == ["--replay none", "--replay r3"]
    out = compare_runs(two_runs, str(tmp_path / "sub" / "cmp.png"))
    assert os.path.getsize(out) > 10_000
    assert main([*two_runs, "--out", str(tmp_path / "cli.png")]) == str(tmp_path / "cli.png")


def test_differing_flags_and_labels(tmp_path):
    a = dict(replay="r3", r3=True, seed=0, out="x", model=dict(L=2))
    b = dict(replay="none", r3=False, seed=0, out="y", model=dict(L=4))
    assert differing_flags([a, b]) == ["replay", "model"]
    for name in ("p", "q"):
        (tmp_path / name).mkdir()
    assert run_labels([str(tmp_path / "p"), str(tmp_path / "q")]) == ["p", "q"]  # no args.json: folder names


def test_plot_run_with_eval_panels(tmp_path):
    recs = [dict(step=s, reward=0.5, kl=1e-3, extreme_frac=0.0, router_flip_rate=None, token_flip_rate=None,
                 grad_norm=1.0, response_length=5, entropy=0.3) for s in range(4)]
    recs[1].update({"eval/accuracy": 0.4, "eval/accuracy_greedy": 0.5, "val/kl": 1e-4})
    plot_run(recs, str(tmp_path / "m.png"), "t")
    assert os.path.getsize(tmp_path / "m.png") > 10_000


def test_import_is_lazy_and_tensorboard_optional():
    code = "import sys, r3.runs.plots, r3.tools.inspect, r3.train.evaluate; print('matplotlib' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stderr
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="pip install tensorboard"):
            tensorboard_writer("x")
