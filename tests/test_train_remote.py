"""What this proves: `train.py --engine sglang:URL --r3` trains end to end against a server that speaks SGLang's
protocol (r3.serve, our engine behind HTTP): the weights are synced every step (the server samples what the trainer
holds: with an fp32 server, R3's replayed old-policy pass matches the engine's log-probs to ~0 kl every step), and a
server that is down is a clear error before any step. The two-terminal recipe of docs/servers.md, run as written
(defaults: train.py's task and warm-up model on both sides), trains with R3 and pushes every update to the server;
`--engine sglang:URL1,URL2` splits each step between two servers, which both load every update; a server that refuses
connections and then answers 503 while it loads is waited out with the default --engine-wait (> 90 s), and a stalled
/generate is aborted and retried with --engine-timeout, the run going on. After every sync the weight check passes
on healthy servers (gap within fp32 rounding, logged as sync/check_gap) and stops the run with one error line at a
server that answers its loads but serves corrupted experts (vLLM 0.32's CPU reload bug, as r3.serve emulates it).
Also: `--rollouts` with `--model` trains from disk under torchrun with data shards, the same run as one process."""
import json
import os
import re
import shlex
import subprocess
import sys
import threading

import torch

from r3.rollout.batch import save_batch
from r3.train.collect import reward_batch
from r3.train.config import TrainConfig, parse
from r3.rollout.engine import Engine
from r3.scale.hf import load_pretrained, load_tokenizer
from r3.tasks.jsonl_task import make_jsonl_task
from served import ENV, SMALL, free_port, serving
from test_train_real import TOL, make_checkpoint, metrics, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--task", "sort:3-4", "--warmup-steps", "5", "--prompts-per-step", "4", "--group-size", "2",
        "--val-every", "2", "--val-prompts", "2", "--eval-prompts", "8", "--no-plot", "--quiet", "--lr", "3e-3",
        "--lr-warmup", "1"]


def test_a_server_that_is_down_is_refused_before_training(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TINY, "--engine", "sglang:http://127.0.0.1:9",
                        "--r3", "--steps", "1", "--engine-wait", "1", "--out", str(tmp_path / "run")], cwd=ROOT,
                       capture_output=True, text=True, timeout=240, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode != 0 and "127.0.0.1:9" in r.stderr
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl") or not open(tmp_path / "run" / "metrics.jsonl").read()


def test_bad_engine_spec_is_refused(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--engine", "sglang:localhost:30000"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "expected sglang:http://HOST:PORT" in r.stderr and "or local" in r.stderr


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


def recipe() -> list[str]:
    """The command lines of docs/servers.md's two-terminal recipe, as written (continuations joined)."""
    doc = open(os.path.join(ROOT, "docs", "servers.md")).read()
    section = doc.split("## Try it on one machine: two terminals", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_the_documented_two_terminal_recipe_trains_with_r3(tmp_path):
    mkdir, serve, trainer = recipe()
    assert serve == "python -m r3.serve --weights-root /tmp/r3-weights"  # no flag sets the task or the model
    port = free_port()

    def ours(line):  # the only changes: a free port and a temporary folder instead of /tmp/r3-*
        line = line.replace("/tmp/r3-", f"{tmp_path}/r3-").replace("127.0.0.1:30000", f"127.0.0.1:{port}")
        argv = shlex.split(line)
        return [sys.executable, *argv[1:]] if argv[0] == "python" else argv
    subprocess.run(ours(mkdir), check=True)
    with serving(*ours(serve)[3:], "--port", str(port), cwd=ROOT) as server:  # from the repository root, as
        r = subprocess.run(ours(trainer), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)  # documented
        stats = server.stats()
    assert r.returncode == 0, r.stderr[-3000:]
    m = metrics(tmp_path / "r3-run" / "metrics.jsonl")
    assert [x["step"] for x in m] == [0, 1] and all(x["grad_norm"] > 0 and x["kl"] < 0.05 for x in m)
    args = json.loads((tmp_path / "r3-run" / "args.json").read_text())
    assert args["replay"] == "r3" and args["task"] == "cipher" and args["engine"] == f"sglang:http://127.0.0.1:{port}"
    assert stats["weight_versions"] == ["1", "2", "3"]  # set-up, then after every step
    assert stats["samples"] >= 2 * 16 * 8  # the default 16 prompts x 8 samples a step, from the server


def test_two_servers_share_each_step_and_both_load_every_update(tmp_path):
    (tmp_path / "w").mkdir()
    common = [*SMALL, "--port", "0", "--weights-root", str(tmp_path / "w")]
    with serving(*common, n=2) as (a, b):
        r = train([*TINY, "--engine", f"sglang:{a.url},{b.url}", "--r3", "--rollout-dtype", "fp32", "--steps", "3",
                   "--prompts-per-step", "8", "--weights-dir", str(tmp_path / "w"), "--out", str(tmp_path / "run")],
                  tmp_path)
        sa, sb = a.stats(), b.stats()
    assert r.returncode == 0, r.stderr[-3000:]
    m = metrics(tmp_path / "run" / "metrics.jsonl")
    assert [x["step"] for x in m] == [0, 1, 2] and all(x["kl"] < 1e-8 for x in m)  # both serve the trainer's weights
    # the weight check after every sync: both servers' probe log-probs within fp32 rounding of the trainer's
    assert all(x["sync/check_gap"] < 1e-6 and x["sync/check_tokens"] == 2 * 4 * 16 for x in m)
    assert m[0]["grad_norm"] > 0 and m[1]["val/kl"] >= 0
    assert sa["weight_versions"] == sb["weight_versions"] == ["1", "2", "3", "4"]  # set-up, then after every step
    assert os.path.exists(tmp_path / "w" / "policy" / "config.json")  # the HF layout both loaded
    args = json.loads((tmp_path / "run" / "args.json").read_text())
    assert args["engine"] == f"sglang:{a.url},{b.url}" and args["replay"] == "r3"
    # 8 prompts a step = 2 requests of 4 groups: one to each server, every step (plus val/eval requests)
    assert len(sa["generate_rids"]) >= 3 and len(sb["generate_rids"]) >= 3 and sa["samples"] >= 3 * 4 * 2
    assert sb["samples"] >= 3 * 4 * 2


def test_a_loading_then_stalling_server_is_waited_out_and_the_run_goes_on(tmp_path):
    assert parse(TrainConfig, []).engine_wait > 90  # the default outlasts a 90 s load
    port = free_port()
    (tmp_path / "w").mkdir()
    # --engine-timeout: how long the client gives the stalled /generate before it aborts it; every other answer (the
    # toy model, milliseconds) comes well within it, and one that did not would only be retried
    argv = [sys.executable, os.path.join(ROOT, "train.py"), *TINY, "--engine", f"sglang:http://127.0.0.1:{port}",
            "--r3", "--rollout-dtype", "fp32", "--steps", "2", "--engine-timeout", "5",
            "--weights-dir", str(tmp_path / "w"), "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True)  # before the server
    err, waiting = [], threading.Event()

    def read():
        for line in proc.stderr:
            err.append(line)
            if "waiting for the server at" in line and "connection refused" in line:
                waiting.set()
    threading.Thread(target=read, daemon=True).start()
    try:
        assert waiting.wait(300), "".join(err)[-3000:]  # a bound only: the client's first refused poll opens the port
        with serving(*SMALL, "--port", str(port), "--weights-root", str(tmp_path / "w"), "--test-unavailable", "2",
                     "--test-stall", "1") as server:  # 503 to the first 2 polls; the first /generate hangs
            proc.wait(timeout=600)  # a bound only
            stats = server.stats()
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(err)
    assert proc.returncode == 0, out[-3000:]
    assert [x["step"] for x in metrics(tmp_path / "run" / "metrics.jsonl")] == [0, 1]
    assert stats["unavailable_answers"] == 2 and "is ready after" in out  # both 503s waited out, then on
    first = next(r for r in stats["generate_rids"] if not r[0].startswith("r3-check-"))  # not the weight check's
    assert stats["aborted"][:len(first)] == first  # every rid of the stalled request, aborted one by one
    assert "no answer within 5 s" in out and "retrying" in out


def test_a_server_serving_corrupted_weights_after_a_reload_stops_the_run(tmp_path):
    """r3.serve --test-corrupt-reload answers every load with success but serves misread experts, as vLLM 0.32 on CPU
    does: train.py stops at its first sync with one error line naming the server and the gap; --sync-check warn
    trains on, saying so, and logs the gap."""
    (tmp_path / "w").mkdir()
    with serving(*SMALL, "--port", "0", "--weights-root", str(tmp_path / "w"), "--test-corrupt-reload") as server:
        common = [*TINY, "--engine", f"sglang:{server.url}", "--rollout-dtype", "fp32", "--steps", "1",
                  "--weights-dir", str(tmp_path / "w"), "--eval-every", "0", "--val-every", "0"]
        stopped = train([*common, "--r3", "--out", str(tmp_path / "stopped")], tmp_path)
        warned = train([*common, "--sync-check", "warn", "--out", str(tmp_path / "warned")], tmp_path)
        stats = server.stats()
    lines = [line for line in stopped.stderr.splitlines() if line.strip() and "it/s" not in line and "%|" not in line]
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert lines[-1].startswith(f"error: weight sync (version 1): 1 of 1 server(s) do not serve the weights the "
                                f"trainer wrote: {server.url}: probe log-probs off by ")
    assert "fp32 tolerance" in lines[-1] and "--sync-check warn" in lines[-1]
    log = tmp_path / "stopped" / "metrics.jsonl"
    assert not log.exists() or not log.read_text()  # stopped before any step
    assert warned.returncode == 0, warned.stderr[-3000:]
    assert warned.stderr.count("warning: weight sync (version") == 2  # set-up, then after the step
    (m,) = metrics(tmp_path / "warned" / "metrics.jsonl")
    assert m["sync/check_gap"] > 1e-3 and m["router_flip_rate"] > 0  # the misread experts route differently too
    assert stats["weight_versions"] == ["1", "1", "2"]  # every load was answered with success

