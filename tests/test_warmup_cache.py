"""What this proves: arms of a sweep that start together on a fresh warm-up cache all get the same model; the first
builds the cache while the others wait for its lock, so no writer removes another's temporary file mid-write (the
race that once failed a parallel sweep)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = """
import sys, torch
torch.set_num_threads(1)
from r3.model import PRESETS
from r3.tasks import make_task
from r3.warmup import warmed_up_model
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
