"""What this proves: `python -m r3.tools.export` writes an HF folder that loads back to exactly the weights it was
given: a preset as train.py builds it (toy-serve: head_dim 32, which vLLM's CPU attention serves) and a train.py run
folder's last checkpoint; a head size CPU engines cannot run is warned about; a wrong invocation is one error line."""
import os
import subprocess
import sys

import torch

from r3.scale.hf import load_config, load_pretrained
from r3.tasks.tasks import make_task
from r3.tools.export import VLLM_CPU_HEAD_SIZES
from r3.train.warmup import load_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")


def export(*args, cwd):
    return subprocess.run([sys.executable, "-m", "r3.tools.export", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=300)


def same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_preset_and_a_run_export_to_the_weights_train_py_holds(tmp_path):
    r = export(str(tmp_path / "hf"), "--preset", "toy-serve", "--task", "sort", "--warmup-steps", "3", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    cfg, dtype = load_config(str(tmp_path / "hf"))
    assert cfg.head_dim == 32 in VLLM_CPU_HEAD_SIZES and dtype == torch.float32 and cfg.vocab_size == 16
    want = load_model("toy-serve", dense=False, task=make_task("sort"), task_spec="sort", warmup_steps=3, init_seed=0,
                      cache_dir=str(tmp_path / ".cache" / "warmup"), progress=False)[0]  # the cache export made
    assert same(load_pretrained(str(tmp_path / "hf")), want)
    t = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--preset", "toy-serve", "--task", "sort",
                        "--warmup-steps", "3", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                        "--eval-every", "0", "--val-every", "0", "--no-plot", "--quiet", "--out", "run"],
                       cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert t.returncode == 0, t.stderr[-2000:]
    r = export(str(tmp_path / "hf_run"), "--run", "run", "--dtype", "bf16", cwd=tmp_path)
    assert r.returncode == 0 and "run/ckpt.pt (step 1)" in r.stdout, r.stderr
    trained = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["model"]
    got = load_pretrained(str(tmp_path / "hf_run")).state_dict()
    assert load_config(str(tmp_path / "hf_run"))[1] == torch.bfloat16
    assert all(torch.equal(got[k], trained[k].bfloat16()) for k in trained)  # one step from the preset: moved
    assert not all(torch.equal(got[k], want.state_dict()[k].bfloat16()) for k in trained)


def test_refusals_are_one_line_and_a_cpu_unservable_head_size_is_warned(tmp_path):
    for args, words in (([str(tmp_path / "a")], "give --run RUN or --preset NAME"),
                        ([str(tmp_path / "a"), "--run", "x", "--preset", "toy"], "give --run RUN or --preset NAME"),
                        ([str(tmp_path / "a"), "--run", str(tmp_path / "nope")], "no such run folder"),
                        ([str(tmp_path), "--preset", "toy"], "holds files; pass --overwrite"),
                        ([str(tmp_path / "a"), "--run", str(tmp_path)], "neither ckpt.pt nor hf/config.json")):
        (tmp_path / "f").touch()
        r = export(*args, cwd=tmp_path)
        assert r.returncode != 0 and r.stderr.strip().splitlines() == [r.stderr.strip()] and words in r.stderr, \
            r.stderr
    r = export(str(tmp_path / "toy16"), "--preset", "toy", "--task", "sort", "--warmup-steps", "0", cwd=tmp_path)
    assert r.returncode == 0 and "warning: head_dim 16: vLLM's CPU attention runs only [32, 64" in r.stderr
