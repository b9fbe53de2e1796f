"""What this proves: `train.py --engine sglang:URL --r3` trains end to end against a server that speaks SGLang's
protocol (r3.serve, our engine behind HTTP): the weights are synced every step (the server samples what the trainer
holds: with an fp32 server, R3's replayed old-policy pass matches the engine's log-probs to ~0 kl every step), and a
server that is down is a clear error before any step. Also: `--rollouts` with `--model` trains from disk under
torchrun with data shards, the same run as one process."""
import json
import os
import subprocess
import sys

import torch

from r3.batch import save_batch
from r3.collect import reward_batch
from r3.engine import Engine
from r3.hf import load_pretrained, load_tokenizer
from r3.jsonl_task import make_jsonl_task
from test_train_real import TOL, make_checkpoint, metrics, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--task", "sort:3-4", "--warmup-steps", "5", "--prompts-per-step", "4", "--group-size", "2",
        "--val-every", "2", "--val-prompts", "2", "--no-plot", "--quiet", "--lr", "3e-3", "--lr-warmup", "1"]


def test_train_with_a_server_engine_end_to_end(toy_server, tmp_path):
    url, root = toy_server
    r = train([*TINY, "--engine", f"sglang:{url}", "--r3", "--rollout-dtype", "fp32", "--steps", "3",
               "--weights-dir", str(root / "w"), "--out", str(tmp_path / "run")], ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    m = metrics(tmp_path / "run" / "metrics.jsonl")
    assert [x["step"] for x in m] == [0, 1, 2]
    assert all(x["kl"] < 1e-8 for x in m), [x["kl"] for x in m]  # fp32 server + replay: the same policy
    assert m[0]["grad_norm"] > 0 and m[1]["val/kl"] >= 0
    assert os.path.exists(root / "w" / "policy" / "config.json")  # HF layout the server loaded
    args = json.loads((tmp_path / "run" / "args.json").read_text())
    assert args["engine"] == f"sglang:{url}" and args["replay"] == "r3"


def test_a_server_that_is_down_is_refused_before_training(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, "--engine", "sglang:http://127.0.0.1:9",
                        "--r3", "--steps", "1", "--engine-wait", "1", "--out", str(tmp_path / "run")], cwd=ROOT,
                       capture_output=True, text=True, timeout=240, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode != 0 and "127.0.0.1:9" in r.stderr
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl") or not open(tmp_path / "run" / "metrics.jsonl").read()


def test_bad_engine_spec_is_refused(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--engine", "sglang:localhost:30000"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "expected local, sglang:http://HOST:PORT" in r.stderr


def test_rollouts_from_disk_with_model_two_ranks_equal_one(tmp_path):
    """Rollouts recorded offline (here by our engine at fp8) train the HF model under torchrun with 2 shards."""
    make_checkpoint(tmp_path / "ckpt")
    rows = [dict(prompt="What is 2 plus 3 ?", answer="5"), dict(prompt="What is 3 plus 4 ?", answer="7")] * 2
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = load_tokenizer(str(tmp_path / "ckpt"))
    task = make_jsonl_task(f"jsonl:{tmp_path / 'qa.jsonl'}", tok, max_new_tokens=6)
    model = load_pretrained(str(tmp_path / "ckpt"), dtype=torch.float32)
    examples = task.sample(4, torch.Generator().manual_seed(0))
    for step in range(2):
        b = Engine(model, "fp8").generate([e.prompt for e in examples], max_new_tokens=6, eos_ids=tok.eos_ids,
                                         pad_id=tok.pad_id, group_size=4, generator=torch.Generator().manual_seed(step))
        reward_batch(task, b, examples)
        save_batch(b, str(tmp_path / "rollouts" / f"step{step}"))
    common = ["--model", str(tmp_path / "ckpt"), "--task", f"jsonl:{tmp_path / 'qa.jsonl'}", "--r3", "--steps", "2",
              "--rollouts", str(tmp_path / "rollouts"), "--prompts-per-step", "4", "--group-size", "4",
              "--shards", "2", "--max-new-tokens", "6", "--logprob-chunk", "16", "--lr", "3e-3", "--lr-warmup", "1",
              "--val-every", "0", "--fsdp-param-dtype", "fp32", "--no-plot", "--quiet", "--overwrite"]
    one = train([*common, "--out", "one"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    two = train([*common, "--out", "two"], tmp_path, nproc=2)
    assert two.returncode == 0, "\n".join(line for line in two.stderr.splitlines() if "it/s" not in line)[-6000:]
    a, b = metrics(tmp_path / "one" / "metrics.jsonl"), metrics(tmp_path / "two" / "metrics.jsonl")
    assert [m["step"] for m in a] == [m["step"] for m in b] == [0, 1]
    for x, y in zip(a, b):
        for k in ("reward", "kl", "loss", "grad_norm", "router_flip_rate"):
            assert abs(x[k] - y[k]) <= TOL * max(1.0, abs(x[k])), (k, x[k], y[k])
    assert any(m["router_flip_rate"] > 0 for m in a) and a[0]["grad_norm"] > 0
