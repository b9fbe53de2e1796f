"""What this proves: the dry-run memory plan gives the known static numbers for Qwen3-30B-A3B on 8 GPUs (about
57 GiB with fp32 master params and fp32 AdamW state), the plan printed in docs/scale.md is what the code gives for
the launch it names, and chunked log-probs equal the full log-softmax gather in value and gradient, without ever
building [B, T, V] logits."""
import pytest
import torch

from r3.scale.memory import GiB, QWEN3_30B_A3B, format_plan, memory_plan, param_counts
from r3.train.score import chunked_logprobs
from r3.model.model import ModelConfig, build_model


def test_param_counts_match_the_model():
    cfg = ModelConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=12, moe_intermediate_size=24, num_experts=6,
                      num_experts_per_tok=2)
    assert param_counts(cfg)["total"] == sum(p.numel() for p in build_model(cfg).parameters())


def test_qwen3_30b_plan_on_8_gpus():
    plan = memory_plan(QWEN3_30B_A3B, 8, optimizer="adamw", param_dtype=torch.bfloat16,
                       master_dtype=torch.float32, seq_len=4096, micro_batch=1, vocab_chunk=1024)
    assert 30.3e9 < plan["n_params"] < 30.7e9 and 3.2e9 < plan["n_active"] < 3.5e9
    assert abs(plan["static"] / GiB - 57) < 2, plan["static"] / GiB
    assert plan["total"] / GiB < 80  # fits an 80 GiB H100 at this sequence length
    text = format_plan(plan)
    assert "static" in text and "GiB" in text
    print("\n" + text)
    half = memory_plan(QWEN3_30B_A3B, 16, seq_len=4096)
    assert abs(half["static"] * 2 - plan["static"]) < 1  # static memory scales as 1 / world_size
    with pytest.raises(ValueError, match="optimizer"):
        memory_plan(QWEN3_30B_A3B, 8, optimizer="lion")


def test_the_plan_in_docs_scale_is_what_the_code_gives():
    """docs/scale.md prints the plan of `--dry-run --world-size 8 --activation-checkpointing --prompts-per-step 64
    --shards 64`: 64 x 8 rows / 64 shards / 4 mini-steps = 2 rows per forward, 4096 positions, bf16 FSDP params."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "docs" / "scale.md").read_text(encoding="utf-8")
    block = re.search(r"```\n(memory plan per GPU: world 8.*?)\n```", text, re.S).group(1)
    plan = memory_plan(QWEN3_30B_A3B, 8, param_dtype=torch.bfloat16, seq_len=4096, micro_batch=2, vocab_chunk=1024,
                       activation_checkpointing=True)
    assert block == format_plan(plan)
    six = memory_plan(QWEN3_30B_A3B, 6, param_dtype=torch.bfloat16, seq_len=4096, micro_batch=2, vocab_chunk=1024,
                      activation_checkpointing=True)  # "Six trainer GPUs do not fit"
    assert f"{six['static'] / GiB:.1f} GiB per GPU ({six['total'] / GiB:.1f} GiB in all" in " ".join(text.split())
    four = memory_plan(QWEN3_30B_A3B, 8, param_dtype=torch.bfloat16, seq_len=4096, micro_batch=4, vocab_chunk=1024,
                       activation_checkpointing=True)  # the default 16 prompts in 8 shards
    assert (f"{four['activations'] / GiB:.1f} GiB of activations, {four['total'] / GiB:.0f} GiB in all"
            in " ".join(text.split()))


@pytest.mark.parametrize("chunk, temperature", [(5, 1.0), (7, 0.7), (1000, 1.0)])
def test_chunked_logprobs_equal_full_gather_and_grads(chunk, temperature):
    torch.manual_seed(0)
    h = torch.randn(3, 11, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 40, (3, 11))
    g = torch.randn(3, 11, dtype=torch.float64)
    want = ((h @ w.T) / temperature).log_softmax(-1).gather(-1, y[..., None])[..., 0]
    gh, gw = torch.autograd.grad((want * g).sum(), (h, w))
    got = chunked_logprobs(h, w, y, chunk=chunk, temperature=temperature)
    ch, cw = torch.autograd.grad((got * g).sum(), (h, w))
    assert got.dtype == torch.float32  # log-probs are always fp32
    assert (got - want).abs().max() < 1e-5
    assert (ch - gh).abs().max() < 1e-5 and (cw - gw).abs().max() < 1e-5  # fp32 softmax inside


def test_chunked_logprobs_never_allocate_full_logits(monkeypatch):
    """Every logits matmul the function runs has at most `chunk` rows, in the forward and in the backward."""
    import r3.train.score as mem
    rows = []
    real = mem.F.linear

    def spy(x, w, *a):
        rows.append(x.shape[0])
        return real(x, w, *a)
    monkeypatch.setattr(mem.F, "linear", spy)
    h = torch.randn(4, 25, 8, requires_grad=True)
    w = torch.randn(30, 8, requires_grad=True)
    chunked_logprobs(h, w, torch.randint(0, 30, (4, 25)), chunk=16).sum().backward()
    assert max(rows) == 16 and len(rows) == 2 * 7  # ceil(100 / 16) chunks, forward + backward


def test_bf16_hidden_matches_model_lm_head():
    model = build_model(ModelConfig(vocab_size=16), seed=0).to(torch.bfloat16)
    ids = torch.randint(0, 16, (2, 9))
    hidden, _ = model(ids, return_hidden=True)
    want = model.lm_head(hidden).float().log_softmax(-1).gather(-1, ids[..., None])[..., 0]
    assert (chunked_logprobs(hidden, model.lm_head.weight, ids, chunk=4) - want).abs().max() < 1e-5
