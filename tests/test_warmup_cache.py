"""What this proves: the warm-up cache cannot go stale: a change to the code that builds the weights, to the task's
data stream or to torch's version is a cache miss, a file whose recorded key differs or whose weights are not finite
is rebuilt, and a diverged warm-up is never cached; arms of a sweep that start together on a fresh cache all get the
same model (the first builds it while the others wait for its lock, so no writer removes another's temporary file
mid-write, the race that once failed a parallel sweep)."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import r3.train.warmup as warmup
from r3.runs.checkpoint import load_weights, save_weights
from r3.model.model import PRESETS, build_model
from r3.tasks.tasks import Example, make_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = """
import sys, torch
torch.set_num_threads(1)
from r3.model.model import PRESETS
from r3.tasks.tasks import make_task
from r3.train.warmup import warmed_up_model
model, path = warmed_up_model(PRESETS["toy"], make_task("sort:3-4"), "sort:3-4", steps=5, seed=0,
                              cache_dir=sys.argv[1], progress=False)
print(path, float(sum(p.double().sum() for p in model.parameters())))
"""


def test_parallel_arms_share_one_warmup(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    for trial in range(3):
        cache = str(tmp_path / f"cache{trial}")
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, cache], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
        assert len({o for o, _ in outs}) == 1  # one cache file, one model, whoever built it
        assert [f for f in os.listdir(cache) if f.endswith(".tmp")] == []


TASK = make_task("sort:2-3")
KW = dict(steps=2, seed=0, batch_size=4, progress=False)


@pytest.fixture
def builds(monkeypatch):
    """Counts the supervised warm-ups that really run (a cache hit runs none)."""
    calls = []
    real = warmup.supervised_warmup

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(warmup, "supervised_warmup", counted)
    return calls


def warm(tmp_path, task=TASK, **kw):
    return warmup.warmed_up_model(PRESETS["toy"], task, "sort:2-3", cache_dir=str(tmp_path / "cache"), **KW, **kw)


def test_the_same_inputs_hit_the_cache(tmp_path, builds):
    model, path = warm(tmp_path)
    again, path2 = warm(tmp_path)
    assert path2 == path and len(builds) == 1
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_a_change_to_the_warmup_code_is_a_cache_miss(tmp_path, monkeypatch, builds):
    copies = []
    for src in warmup.WARMUP_SOURCES:  # digest temp copies, so the test can edit one without touching r3/
        copies.append(str(tmp_path / os.path.basename(src)))
        shutil.copy(src, copies[-1])
    monkeypatch.setattr(warmup, "WARMUP_SOURCES", tuple(copies))
    _, path = warm(tmp_path)
    with open(copies[2], "a") as f:  # warmup.py, say a changed learning-rate schedule
        f.write("\n# changed\n")
    _, path2 = warm(tmp_path)
    assert path2 != path and len(builds) == 2
    assert os.path.basename(copies[2]) == "warmup.py"


def test_a_change_to_the_tasks_data_stream_is_a_cache_miss(tmp_path, builds):
    class Shifted(type(TASK)):
        def example(self, g):  # same task spec string, other examples
            e = super().example(g)
            return Example(e.prompt, e.answer[::-1])
    shifted = Shifted.__new__(Shifted)
    shifted.__dict__.update(TASK.__dict__)
    _, path = warm(tmp_path)
    _, path2 = warm(tmp_path, task=shifted)
    assert path2 != path and len(builds) == 2


def test_another_torch_version_is_a_cache_miss(tmp_path, monkeypatch, builds):
    _, path = warm(tmp_path)
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    _, path2 = warm(tmp_path)
    assert path2 != path and len(builds) == 2


def test_a_cached_file_with_another_recorded_key_is_rebuilt(tmp_path, builds, capsys):
    model, path = warm(tmp_path)
    key = dict(warmup.warmup_key(PRESETS["toy"], TASK, "sort:2-3", steps=2, seed=0, batch_size=4, lr=3e-3),
               code="an older warm-up")
    save_weights(build_model(PRESETS["toy"], 1), path, dict(key=key))  # other weights under the right name
    again, path2 = warm(tmp_path)
    assert path2 == path and len(builds) == 2
    assert f"warm-up cache {path} was made under another key (differs in code)" in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert warmup._cached(build_model(PRESETS["toy"], 0), path, warmup.warmup_key(
        PRESETS["toy"], TASK, "sort:2-3", steps=2, seed=0, batch_size=4, lr=3e-3))[0] is not None  # the file is new


def test_a_cached_file_with_non_finite_weights_is_rebuilt(tmp_path, builds, capsys):
    model, path = warm(tmp_path)
    meta_key = warmup.warmup_key(PRESETS["toy"], TASK, "sort:2-3", steps=2, seed=0, batch_size=4, lr=3e-3)
    bad = load_weights(build_model(PRESETS["toy"], 0), path)
    with torch.no_grad():
        bad.lm_head.weight[3, 1] = float("nan")
    save_weights(bad, path, dict(key=meta_key))  # the right key, NaN weights
    again, _ = warm(tmp_path)
    assert len(builds) == 2
    out = capsys.readouterr().out
    assert "tensor 'lm_head.weight' holds 1 non-finite value(s) (first at index [3, 1]: nan)" in out
    assert out.rstrip().endswith("rebuilding it")
    assert all(torch.isfinite(p).all() for p in again.parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_a_diverged_warmup_is_an_error_and_is_not_cached(tmp_path):
    with pytest.raises(RuntimeError, match="warm-up diverged: .* non-finite after 2 steps at lr inf"):
        warm(tmp_path, lr=float("inf"))
    assert [f for f in os.listdir(tmp_path / "cache") if f.endswith(".safetensors")] == []
