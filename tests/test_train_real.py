"""What this proves: train.py's real-model path runs end to end on an HF-layout checkpoint with a tokenizer and a
jsonl task, and under `torch.distributed.run` with 2 gloo processes (FSDP2, R3, per-rank data shards) it logs the
same global metrics and saves the same HF weights as one plain process over the same shards, bit for bit;
`--dry-run` prints the Qwen3-30B-A3B plan from config.json alone; mismatched --model / --task combinations fail
with clear errors."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import gloo_died, rank_errors
from r3.train.config import TrainConfig, parse
from r3.scale.fsdp import global_mean
from r3.train.grpo import MAX_METRICS
from r3.scale.hf import load_pretrained, save_pretrained
from r3.model.model import ModelConfig, build_model
from test_hf_parity import QWEN3_30B_A3B_CONFIG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "train.py")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["user", "assistant", "What", "is", "plus", "?", "2", "3", "4", "the", "answer", "so"]
ANSWERS = ["\\boxed{5}", "\\boxed{7}"]  # one token each, so an untrained model sometimes says the right one
REQUIRED = ["step", "reward", "kl", "kl_full", "extreme_frac", "router_flip_rate", "token_flip_rate",
            "flips_per_token", "entropy", "grad_norm", "response_length", "clip_frac", "exact", "loss", "step_time"]
# The 2-rank run must equal the 1-process run bit for bit (fp32 compute): the same data shards, the same gradient
# per shard, a gradient sum of two addends (exact in either order), the same Adam per element, and a gradient norm
# reduced in one order at any world size (r3.scale.fsdp.clip_grad_norm). A tolerance here would hide nothing useful:
# Adam normalises each coordinate, so a last-bit difference in the clip coefficient grew to 3.7e-5 in the final weights
# on one machine, and nothing bounds it below the size of the update itself (lr 3e-3).
TOL = 0.0  # relative; tests/test_train_remote.py compares its FSDP run with this too: exact


def make_checkpoint(d):
    """A 2-layer, 8-expert Qwen3-MoE in HF layout with a WordLevel tokenizer (ChatML specials) and EOS ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {w: i for i, w in enumerate(SPECIAL + ["[UNK]"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL)
    tok.add_tokens(ANSWERS)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, num_experts=8,
                      num_experts_per_tok=2, max_position_embeddings=64)
    save_pretrained(build_model(cfg, seed=0).init_weights(0, std=0.3), str(d))
    tok.save(str(d / "tokenizer.json"))
    (d / "generation_config.json").write_text(json.dumps(dict(eos_token_id=[vocab["<|im_end|>"],
                                                                            vocab["<|endoftext|>"]])))
    (d / "tokenizer_config.json").write_text(json.dumps(dict(pad_token="<|endoftext|>")))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    d = tmp_path_factory.mktemp("real")
    make_checkpoint(d / "ckpt")
    rows = [dict(prompt="What is 2 plus 3 ?", answer="5"), dict(prompt="What is 3 plus 4 ?", answer="7"),
            dict(prompt="What is 4 plus 3 ?", answer=7), dict(prompt="What is 3 plus 2 ?", answer="5")]
    (d / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def train(args, cwd, nproc=1):
    launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  f"--nproc_per_node={nproc}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    r = subprocess.run(launch + [TRAIN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    if nproc > 1 and r.returncode != 0 and gloo_died(r.stderr):  # retried once (conftest.gloo_died)
        r = subprocess.run(launch + [TRAIN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    return r


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_two_process_fsdp_run_matches_one_process(real):
    common = ["--model", str(real / "ckpt"), "--task", f"jsonl:{real / 'qa.jsonl'}", "--r3", "--steps", "2",
              "--prompts-per-step", "4", "--group-size", "4", "--shards", "2", "--max-new-tokens", "6",
              "--logprob-chunk", "16", "--lr", "3e-3", "--lr-warmup", "1", "--rollout-dtype", "fp8",
              "--val-every", "2", "--val-prompts", "2",
              "--fsdp-param-dtype", "fp32", "--no-plot", "--quiet", "--overwrite"]
    one = train([*common, "--out", "one"], real)
    assert one.returncode == 0, one.stderr[-3000:]
    two = train([*common, "--out", "two", "--activation-checkpointing"], real, nproc=2)
    assert two.returncode == 0, rank_errors(two.stderr)
    a, b = metrics(real / "one" / "metrics.jsonl"), metrics(real / "two" / "metrics.jsonl")
    assert [m["step"] for m in a] == [m["step"] for m in b] == [0, 1]
    assert json.loads((real / "two" / "run.json").read_text())["world_size"] == 2
    for x, y in zip(a, b):
        assert set(REQUIRED) <= set(x), set(REQUIRED) - set(x)
        assert x["kl_full"] is None and x["entropy"] > 0  # the chunked log-prob path
        same = lambda u, v: u == v or (isinstance(u, float) and isinstance(v, float) and u != u and v != v)  # noqa
        assert {k: (x[k], y[k]) for k in x if k != "step_time" and not same(x[k], y[k])} == {}  # every metric
    assert any(0 < m["reward"] < 1 for m in a) and a[0]["grad_norm"] > 0  # rewards varied, so the step trained
    assert any(m["router_flip_rate"] > 0 for m in a)  # fp8 rollouts route differently: flips are compared too
    wa, wb = (load_pretrained(str(real / r / "hf")).state_dict() for r in ("one", "two"))
    w0 = load_pretrained(str(real / "ckpt")).state_dict()
    assert [k for k in wa if not torch.equal(wa[k], wb[k])] == []  # the saved weights, bit for bit
    assert max((wa[k] - w0[k]).abs().max().item() for k in wa) > 1e-4  # and training moved the weights
    r = train([*common, "--out", "two", "--resume"], real, nproc=2)  # refused, not half-done
    assert r.returncode != 0 and "--resume is not supported under torchrun" in r.stderr


def test_dry_run_prints_the_30b_plan_from_config_only(tmp_path):
    (tmp_path / "q30b").mkdir()
    (tmp_path / "q30b" / "config.json").write_text(json.dumps(QWEN3_30B_A3B_CONFIG))
    r = train(["--model", str(tmp_path / "q30b"), "--dry-run", "--world-size", "8", "--activation-checkpointing"],
              tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "world 8" in r.stdout and "30.53B / 3.35B" in r.stdout
    static = next(line for line in r.stdout.splitlines() if "= static" in line)
    assert abs(float(static.split()[-2]) - 57) < 1, static
    r = train(["--preset", "toy", "--dry-run"], tmp_path)
    assert r.returncode == 0 and "world 1" in r.stdout, r.stderr[-3000:]
    r = train(["--preset", "toy", "--task", "jsonl:qa.jsonl", "--dry-run"], tmp_path)  # a preset, a text task
    assert r.returncode == 0 and "world 1" in r.stdout, r.stderr[-3000:]
    assert not os.path.exists(tmp_path / "runs")  # a dry run writes nothing


def test_shard_metrics_are_weighted_means_and_largest_values_stay_largest():
    """Data shards of one process (the ranks of a torchrun add an all-reduce of the same sums and maxima)."""
    parts = [({"kl": 1.0, "grpo/max_abs_log_ratio": 0.5, "seq_is/max_log_w": 3.0, "kl_full": None}, 1.0),
             ({"kl": 4.0, "grpo/max_abs_log_ratio": 2.0, "seq_is/max_log_w": -1.0, "kl_full": None}, 3.0)]
    m = global_mean(parts, maxima=MAX_METRICS)
    assert m == {"kl": (1.0 + 3 * 4.0) / 4, "grpo/max_abs_log_ratio": 2.0, "seq_is/max_log_w": 3.0, "kl_full": None}
    nan = global_mean([({"seq_is/max_log_w": 1.0}, 1.0), ({"seq_is/max_log_w": float("nan")}, 1.0)],
                      maxima=MAX_METRICS)
    assert nan["seq_is/max_log_w"] != nan["seq_is/max_log_w"]  # a NaN in any shard is not hidden by the max


@pytest.mark.parametrize("argv, words", [
    (["--shards", "128"], "--prompts-per-step 16 does not split into 128 equal shards"),
    (["--shards", "12", "--prompts-per-step", "12"], "--shards 12 is not a multiple of the world size 8"),
    (["--shards", "8", "--prompts-per-step", "8", "--group-size", "2", "--mini-steps", "4"],
     "--mini-steps 4 is more than the 2 rows"),
])
def test_a_shard_layout_training_would_refuse_is_refused_by_the_dry_run_too(tmp_path, argv, words):
    (tmp_path / "q30b").mkdir()
    (tmp_path / "q30b" / "config.json").write_text(json.dumps(QWEN3_30B_A3B_CONFIG))
    r = train(["--model", str(tmp_path / "q30b"), "--dry-run", "--world-size", "8", *argv], tmp_path)
    assert r.returncode == 1 and words in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_a_bad_shard_layout_is_refused_before_the_model_loads(tmp_path):
    """The checkpoint folder does not exist: the refusal names the shards, so it came before any loading."""
    r = train(["--model", str(tmp_path / "absent"), "--task", "jsonl:qa.jsonl", "--shards", "3", "--out", "o"],
              tmp_path)
    assert r.returncode == 1 and "does not split into 3 equal shards" in r.stderr, r.stderr[-3000:]
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("argv, words", [
    (["--model", "CKPT", "--task", "sort"], "--model needs --task jsonl:FILE"),
    (["--task", "jsonl:qa.jsonl"], "needs --model PATH"),
    (["--model", "CKPT", "--task", "jsonl:qa.jsonl", "--dense"], "no dense twin"),
    (["--shards", "0"], "--shards must be >= 1"),
])
def test_mismatched_model_and_task_fail_clearly(argv, words, capsys):
    with pytest.raises(SystemExit):
        parse(TrainConfig, argv)
    assert words in capsys.readouterr().err


def test_one_process_real_run_resumes_bit_identically(real):
    """One process with --model keeps the toy loop's resumable ckpt.pt; a resumed run logs the same metrics."""
    common = ["--model", str(real / "ckpt"), "--task", f"jsonl:{real / 'qa.jsonl'}", "--steps", "2",
              "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--save-every", "1",
              "--val-every", "0", "--no-plot", "--quiet"]
    assert train([*common, "--out", "ref"], real).returncode == 0
    assert train([*common, "--steps", "1", "--out", "res"], real).returncode == 0
    r = train([*common, "--out", "res", "--resume"], real)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = metrics(real / "ref" / "metrics.jsonl"), metrics(real / "res" / "metrics.jsonl")
    for x, y in zip(a, b):
        x.pop("step_time"), y.pop("step_time")
        assert x == y
    assert a[0]["kl_full"] is not None  # a small vocabulary: full logits by default, so kl_full is logged
    assert torch.equal(load_pretrained(str(real / "ref" / "hf")).lm_head.weight,
                       load_pretrained(str(real / "res" / "hf")).lm_head.weight)
