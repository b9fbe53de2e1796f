"""What this proves: `load_pretrained` turns HF Qwen3-MoE checkpoints into our model with HF's logits (fp32 ≤ 1e-5,
bf16 ≤ 0.05 max-abs) and HF's exact router choices, `save_pretrained` writes checkpoints HF reads back, and broken
checkpoints or unsupported configs fail with an error naming the key, file or field."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from r3.scale.hf import CheckpointError, config_from_hf, load_pretrained, save_pretrained
from r3.model.model import ModelConfig, build_model

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # the test extra (pyproject.toml); never skipped

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=128,
            rope_theta=1e6, rms_norm_eps=1e-6)
CONFIGS = {  # GQA ratio, head_dim vs hidden/heads, norm_topk_prob, top-k, shard layout
    "gqa2-hd16-norm-k2": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=24,
                              num_experts=8, num_experts_per_tok=2, norm_topk_prob=True),
    "gqa4-hd4-nonorm-k3": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=4, moe_intermediate_size=16,
                               num_experts=6, num_experts_per_tok=3, norm_topk_prob=False),
    "mha-hd32-norm-k4-sharded": dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=4, head_dim=32,
                                     moe_intermediate_size=24, num_experts=8, num_experts_per_tok=4,
                                     norm_topk_prob=True, shard="16KB"),
    "gqa1-nonorm-k1": dict(num_attention_heads=2, num_key_value_heads=1, head_dim=16, moe_intermediate_size=24,
                           num_experts=4, num_experts_per_tok=1, norm_topk_prob=False),
}
FP32_TOL, BF16_TOL = 1e-5, 0.05  # bf16: both sides round the same ops; measured 0.0 on CPU (see docs_scaling.md)
# (HF 5.x runs experts with torch._grouped_mm, whose bf16 path needs 16-byte strides: keep sizes multiples of 8)


def random_hf(kw: dict, seed: int = 0) -> Qwen3MoeForCausalLM:
    """A tiny HF model with weights large enough (std 0.3, norms ≈ 1 ± 0.1) that routing is far from uniform."""
    kw = {k: v for k, v in {**BASE, **kw}.items() if k != "shard"}
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return model


def hf_forward(model, ids, **kw):
    """HF logits and the expert ids its routers chose, [B, T, L, K] (hooks on each `mlp.gate`)."""
    chosen = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, out: chosen.append(out[2]))
             for layer in model.model.layers]
    with torch.no_grad():
        logits = model(ids, **kw).logits
    for h in hooks:
        h.remove()
    B, T = ids.shape
    return logits, torch.stack([c.view(B, T, -1) for c in chosen], dim=2)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, kw in CONFIGS.items():
        path = str(tmp_path_factory.mktemp(name))
        random_hf(kw).save_pretrained(path, max_shard_size=kw.get("shard", "50MB"))
        out[name] = path
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_routes_match_hf(name, checkpoints):
    path = checkpoints[name]
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json")) == ("shard" in CONFIGS[name])
    ids = torch.randint(0, 64, (3, 19), generator=torch.Generator().manual_seed(1))
    for dtype, tol in ((torch.float32, FP32_TOL), (torch.bfloat16, BF16_TOL)):
        hf = Qwen3MoeForCausalLM.from_pretrained(path, dtype=dtype).eval()
        want, hf_routes = hf_forward(hf, ids)
        ours = load_pretrained(path, dtype=dtype)
        assert all(p.dtype == dtype and p.device.type == "cpu" for p in ours.parameters())
        with torch.no_grad():
            got, routes = ours(ids)
        diff = (got.float() - want.float()).abs().max().item()
        print(f"{name} {dtype}: logits max-abs diff {diff:.3g} (|logits| max {want.abs().max():.3g})")
        assert diff <= tol, f"{name} {dtype}: max-abs logit diff {diff} > {tol}"
        assert torch.equal(routes, hf_routes.long()), f"{name} {dtype}: our expert ids differ from HF's router"


def test_padded_batch_matches_hf_on_valid_positions(checkpoints):
    path = checkpoints["gqa2-hd16-norm-k2"]
    hf, ours = Qwen3MoeForCausalLM.from_pretrained(path).eval(), load_pretrained(path)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[0, :4] = False  # left padding, positions restart at the first real token (as our model numbers them)
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    want, hf_routes = hf_forward(hf, ids, attention_mask=valid.long(), position_ids=pos)
    with torch.no_grad():
        got, routes = ours(ids, valid_BT=valid)
    assert (got - want)[valid].abs().max() <= FP32_TOL
    assert torch.equal(routes[valid], hf_routes.long()[valid])


def test_config_accepts_4x_and_5x_names():
    v4 = dict(architectures=["Qwen3MoeForCausalLM"], vocab_size=64, hidden_size=32, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=24, num_experts=8,
              num_experts_per_tok=2, rope_theta=1e6, torch_dtype="bfloat16", norm_topk_prob=True)
    v5 = {k: v for k, v in v4.items() if k not in ("num_experts", "rope_theta", "torch_dtype")}
    v5.update(num_local_experts=8, rope_parameters=dict(rope_theta=1e6, rope_type="default"), dtype="bfloat16")
    assert config_from_hf(v4) == config_from_hf(v5)
    cfg, dtype = config_from_hf(v5)
    assert (cfg.num_experts, cfg.rope_theta, dtype, cfg.norm_topk_prob) == (8, 1e6, torch.bfloat16, True)
    del v5["norm_topk_prob"]
    assert config_from_hf(v5)[0].norm_topk_prob is False  # the HF class default, not ours


QWEN3_30B_A3B_CONFIG = {  # Qwen/Qwen3-30B-A3B config.json as published (transformers 4.51 names)
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}


def test_qwen3_30b_a3b_config_is_supported():
    from r3.scale.memory import QWEN3_30B_A3B
    assert config_from_hf(QWEN3_30B_A3B_CONFIG) == (QWEN3_30B_A3B, torch.bfloat16)


@pytest.mark.parametrize("field, value", [
    ("architectures", ["Qwen2MoeForCausalLM"]), ("mlp_only_layers", [0]), ("decoder_sparse_step", 2),
    ("tie_word_embeddings", True), ("use_sliding_window", True), ("attention_bias", True),
    ("rope_scaling", {"type": "yarn", "factor": 4.0}), ("hidden_act", "gelu")])
def test_unsupported_config_names_the_field(field, value, checkpoints, tmp_path):
    raw = json.load(open(os.path.join(checkpoints["gqa2-hd16-norm-k2"], "config.json")))
    raw[field] = value
    with pytest.raises(CheckpointError, match=field):
        config_from_hf(raw)


def _single_file_copy(src: str, dst, edit) -> str:
    """Copy a one-file checkpoint, letting `edit` change its tensors dict."""
    os.makedirs(dst, exist_ok=True)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    edit(tensors)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
        g.write(f.read())
    return str(dst)


EXPERT = "model.layers.1.mlp.experts.5.up_proj.weight"
BROKEN = {
    "missing key": (lambda t: t.pop(EXPERT), "missing keys.*" + EXPERT.replace(".", r"\.")),
    "missing whole key": (lambda t: t.pop("model.norm.weight"), r"missing keys.*model\.norm\.weight"),
    "unexpected key": (lambda t: t.update({"model.layers.0.mlp.shared_expert.weight": torch.zeros(2)}),
                       r"unexpected key 'model\.layers\.0\.mlp\.shared_expert\.weight'"),
    "expert out of range": (lambda t: t.update({"model.layers.0.mlp.experts.8.up_proj.weight": t[EXPERT].clone()}),
                            r"experts\.8\.up_proj.*config has 8 experts"),
    "bad shape": (lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 31)}),
                  r"q_proj\.weight' has shape \(64, 31\), the model needs \(64, 32\)"),
    "bad expert shape": (lambda t: t.update({EXPERT: torch.zeros(24, 33)}), r"up_proj\.weight' has shape \(24, 33\)"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_checkpoint_names_the_problem(case, checkpoints, tmp_path):
    edit, words = BROKEN[case]
    path = _single_file_copy(checkpoints["gqa2-hd16-norm-k2"], tmp_path, edit)
    with pytest.raises(CheckpointError, match=words):
        load_pretrained(path)


def test_truncated_or_missing_shard_names_the_file(checkpoints, tmp_path):
    src = checkpoints["mha-hd32-norm-k4-sharded"]
    for fn in os.listdir(src):
        with open(os.path.join(src, fn), "rb") as f, open(tmp_path / fn, "wb") as g:
            g.write(f.read())
    shard = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))[1]
    data = (tmp_path / shard).read_bytes()
    (tmp_path / shard).write_bytes(data[:len(data) - 100])
    with pytest.raises(CheckpointError, match=f"{shard}: corrupt or truncated"):
        load_pretrained(str(tmp_path))
    (tmp_path / shard).unlink()
    with pytest.raises(CheckpointError, match=f"lists shard '{shard}', which does not exist"):
        load_pretrained(str(tmp_path))


def test_fused_gate_up_layout_loads_too(checkpoints, tmp_path):
    """transformers 5.x keeps experts fused in memory; a file written from that state dict must load the same."""
    path = checkpoints["gqa2-hd16-norm-k2"]
    hf = Qwen3MoeForCausalLM.from_pretrained(path).eval()
    fused = hf.state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused
    save_file({k: v.contiguous() for k, v in fused.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    fused_model, per_expert = load_pretrained(str(tmp_path)), load_pretrained(path)
    for (n, a), (m, b) in zip(fused_model.state_dict().items(), per_expert.state_dict().items()):
        assert n == m and torch.equal(a, b), n
    with torch.no_grad():  # equal weights; allow float noise from different memory alignment of the copies
        assert (fused_model(ids)[0] - per_expert(ids)[0]).abs().max() <= FP32_TOL


def test_save_pretrained_round_trips_and_hf_reads_it(tmp_path):
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, moe_intermediate_size=24, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=False, rope_theta=5e5)
    ours = build_model(cfg, seed=4).init_weights(4, std=0.3)
    save_pretrained(ours, str(tmp_path), max_shard_size="10KB")
    index = json.load(open(tmp_path / "model.safetensors.index.json"))["weight_map"]
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in index and len(set(index.values())) > 2
    raw = json.load(open(tmp_path / "config.json"))
    assert raw["num_experts"] == 8 and raw["rope_theta"] == 5e5 and raw["torch_dtype"] == "float32"  # 4.x names
    back = load_pretrained(str(tmp_path))
    assert back.cfg == cfg
    for (n, a), (m, b) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert n == m and torch.equal(a, b), n
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(5))
    want, hf_routes = hf_forward(Qwen3MoeForCausalLM.from_pretrained(str(tmp_path)).eval(), ids)
    with torch.no_grad():
        got, routes = ours(ids)
    assert (got - want).abs().max() <= FP32_TOL and torch.equal(routes, hf_routes.long())
    save_pretrained(ours, str(tmp_path / "bf16"), dtype=torch.bfloat16)  # one file, cast while writing
    assert json.load(open(tmp_path / "bf16" / "config.json"))["torch_dtype"] == "bfloat16"
    half = load_pretrained(str(tmp_path / "bf16"))  # dtype None: the stored one
    assert all(torch.equal(a.to(torch.bfloat16), b) for a, b in zip(ours.parameters(), half.parameters()))
