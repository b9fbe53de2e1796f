"""A small, self-contained Qwen3-MoE transformer (and its dense twin), written to match HF `Qwen3MoeForCausalLM`.

Architecture: RMSNorm computed in fp32 then multiplied by the weight; rotate_half RoPE; GQA attention
with per-head RMSNorm on q and k before RoPE; every layer sparse (see `r3/model/moe.py`); untied `lm_head`.
Parameter names are HF's (`model.layers.3.self_attn.q_proj.weight`, `model.layers.3.mlp.gate.weight`, ...) except
that the experts of a layer are stacked into three [E, ., .] tensors.

State is carried through `forward` as explicit arguments, never hidden in modules:
  valid_BT     which positions hold real tokens (False = padding; padded keys are invisible to attention);
               None = no padding (an uncached forward then attends causally without a mask)
  routes_BTLK  expert ids to replay (R3 / R2); None = the router's own top-k
  kv_cache     a `KVCache` to append to (the rollout engine's decode path)
Every forward returns (logits or hidden, routes_BTLK): the expert ids it used, [B, T, L, K], or None when dense.

Left out on purpose: sliding-window attention, `mlp_only_layers` / `decoder_sparse_step` (Qwen3-30B-A3B uses
neither), the auxiliary load-balancing loss (RL fine-tuning of a trained MoE does not need it).
"""
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from r3.model.moe import MLP, MoE, RoutesError, check_routes
from r3.model.routing import routes_dtype


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 16
    hidden_size: int = 64
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    moe_intermediate_size: int = 64
    num_experts: int = 8
    num_experts_per_tok: int = 2
    norm_topk_prob: bool = True
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 256
    dense: bool = False  # the dense twin: one SwiGLU MLP of width K·moe_intermediate_size per layer

    def dense_twin(self) -> "ModelConfig":
        """Same everything, but an MLP with the MoE's *active* width in place of the sparse block."""
        return replace(self, dense=True)

    @property
    def dense_intermediate_size(self) -> int:
        return self.num_experts_per_tok * self.moe_intermediate_size


PRESETS = {
    "toy": ModelConfig(),
    "toy-wide": ModelConfig(hidden_size=128, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                            moe_intermediate_size=96, num_experts=16),
    # Qwen3-30B-A3B's routing shape at toy width: many small experts, top-8 of 64 (Qwen3: 128), norm_topk_prob,
    # 6 layers so a token can flip in several. Under an fp8 rollout ~7 % of routers flip (toy: ~1.5 %).
    "qwen3-ratio": ModelConfig(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, moe_intermediate_size=16, num_experts=64, num_experts_per_tok=8,
                               norm_topk_prob=True),
    # Qwen3-30B-A3B's routing (8 of 128 experts, norm_topk_prob) at toy width, 48 layers as the real model has: the
    # depth rule of experiments/regime (the shallowest of 6, 12, 24, 48 at which an fp8-router engine flips >= 90 %
    # of tokens at the start of RL; none of 6, 12, 24 did, results/regime/regime.md). Deep and thin: it learns slowly.
    "qwen3-routing": ModelConfig(hidden_size=64, num_hidden_layers=48, num_attention_heads=4, num_key_value_heads=2,
                                 head_dim=16, moe_intermediate_size=16, num_experts=128, num_experts_per_tok=8,
                                 norm_topk_prob=True),
    # the toy at head_dim 32, which real engines' CPU attention serves (vLLM 0.32: head sizes 32, 64, 80, ...; the
    # toy's 16 starts and dies at the first request): what `python -m r3.tools.export` writes for a real server
    "toy-serve": ModelConfig(head_dim=32),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's order: normalise in fp32, cast back, then multiply by the weight."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(pos_BT: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=pos_BT.device).float()
                                / head_dim))
    freqs_BTF = pos_BT.float()[..., None] * inv_freq
    emb = torch.cat((freqs_BTF, freqs_BTF), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class KVCache:
    """Per-layer keys/values plus, for every cached position, its validity and the routes that produced it.

    Keeping routes beside K/V means any reuse of cached positions (a shared prompt, an earlier turn) reuses the
    routes recorded when those positions were computed, kept in step by construction. They are stored in the dtype
    the Batch keeps (`r3.model.routing.routes_dtype`: uint8 up to 256 experts), so the only cast is to int64 at replay.

    K and V are computed in `dtype` (the engine's) and held in fp32, which represents every bf16 / fp16 value
    exactly: `decode_attention` reads them without a cast each step, and a prefill chunk casts its slice back.
    """

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, dtype: torch.dtype, device="cpu"):
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=torch.float32, device=device)  # values of `dtype` (see above)
        self.v = torch.zeros(shape, dtype=torch.float32, device=device)
        self.valid = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.routes = None if cfg.dense else torch.zeros(
            batch, max_len, cfg.num_hidden_layers, cfg.num_experts_per_tok, dtype=routes_dtype(cfg.num_experts),
            device=device)
        self.length = 0
        self.prefill_tokens = 0  # positions computed by forwards with more than one new position
        self.decode_tokens = 0

    @property
    def max_len(self) -> int:
        return self.valid.shape[1]

    def n_valid(self) -> torch.Tensor:
        return self.valid[:, :self.length].sum(1)

    def commit(self, valid_BT: torch.Tensor, routes_BTLK: torch.Tensor | None) -> None:
        T = valid_BT.shape[1]
        self.valid[:, self.length:self.length + T] = valid_BT
        if self.routes is not None:
            self.routes[:, self.length:self.length + T] = routes_BTLK.to(self.routes.dtype)
        if T > 1:
            self.prefill_tokens += T * valid_BT.shape[0]
        else:
            self.decode_tokens += valid_BT.shape[0]
        self.length += T

    def _like(self, k, v, valid, routes) -> "KVCache":
        """A cache with these tensors and this cache's length and counters."""
        out = KVCache.__new__(KVCache)
        out.k, out.v, out.valid, out.routes = k, v, valid, routes
        out.length, out.prefill_tokens, out.decode_tokens = self.length, self.prefill_tokens, self.decode_tokens
        return out

    def repeat_interleave(self, n: int) -> "KVCache":
        """Expand each row to n rows (a prompt prefilled once, shared by a GRPO group of n samples)."""
        return self._like(self.k.repeat_interleave(n, dim=1), self.v.repeat_interleave(n, dim=1),
                          self.valid.repeat_interleave(n, dim=0),
                          None if self.routes is None else self.routes.repeat_interleave(n, dim=0))

    def grow(self, max_len: int) -> "KVCache":
        """Room for `max_len` positions, holding the same prefix (a copy, no recompute); self if it already fits."""
        extra = max_len - self.max_len
        if extra <= 0:
            return self
        return self._like(F.pad(self.k, (0, 0, 0, extra)), F.pad(self.v, (0, 0, 0, extra)),
                          F.pad(self.valid, (0, extra)),
                          None if self.routes is None else F.pad(self.routes, (0, 0, 0, 0, 0, extra)))


class Attention(nn.Module):
    """GQA without copying K/V: SDPA's `enable_gqa` when several positions are new (training, prefill); for one
    new position (decode) the H / Hkv query heads that share a KV head become that head's query rows."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        H, Hkv, hd, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(D, H * hd, bias=False)
        self.k_proj = nn.Linear(D, Hkv * hd, bias=False)
        self.v_proj = nn.Linear(D, Hkv * hd, bias=False)
        self.o_proj = nn.Linear(H * hd, D, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.qkv_proj = None  # [(H + 2 Hkv)·hd, D] once `fuse_qkv_` ran: the q/k/v weights are views of it

    @torch.no_grad()
    def fuse_qkv_(self) -> "Attention":
        """Hold the q, k, v weights in one matrix, the three `weight` parameters becoming views of its rows: one
        matmul in place of three. For the rollout engine's copy; like `Experts.fuse_gate_up_`, names, state dict and
        values are unchanged, writes through the parameters land in the fused matrix, `.to()` re-fuses."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        qkv = torch.cat([p.weight for p in projs])
        self.qkv_proj = qkv
        for p, w in zip(projs, qkv.split([p.weight.shape[0] for p in projs])):
            p.weight = nn.Parameter(w, requires_grad=p.weight.requires_grad)
        return self

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self.qkv_proj is not None:
            self.fuse_qkv_()
        return out

    def _fused_qkv(self, x_BTD, cos, sin):
        """q, k, v [B, heads, T, hd] from the fused matrix, q and k normed and rotated together as one
        [B, T, H + Hkv, hd] tensor (one norm weight row per head): half the small ops of doing them apart, and the
        same expression on every element, so the same numbers (tests/test_engine.py)."""
        cfg = self.cfg
        H, Hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qk, v = F.linear(x_BTD, self.qkv_proj).unflatten(-1, (-1, hd)).split([H + Hkv, Hkv], 2)
        w = torch.cat([self.q_norm.weight.expand(H, hd), self.k_norm.weight.expand(Hkv, hd)])
        qk = rms_norm(qk, w, cfg.rms_norm_eps)
        cos, sin = cos[:, :, None], sin[:, :, None]
        q, k = (qk * cos + rotate_half(qk) * sin).split([H, Hkv], 2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x_BTD, cos, sin, mask, kv_cache: KVCache | None, layer: int, *, prefix=None, kv_out=None):
        """`mask`: bool [B, 1, T, S] (True = may attend), [B, 1, 1, S] for one new position, or None = causal.
        `prefix`: (k, v) [B, Hkv, P, hd] of P earlier positions to attend to (r3/model/prefix.py; S = P + T); `kv_out`:
        a list this call appends its own (k, v) to."""
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        if self.qkv_proj is None:
            q, k, v = self.q_proj(x_BTD), self.k_proj(x_BTD), self.v_proj(x_BTD)
            q = self.q_norm(rearrange(q, "b t (h d) -> b h t d", d=cfg.head_dim))
            k = self.k_norm(rearrange(k, "b t (h d) -> b h t d", d=cfg.head_dim))
            v = rearrange(v, "b t (h d) -> b h t d", d=cfg.head_dim)
            cos, sin = cos[:, None], sin[:, None]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        else:
            q, k, v = self._fused_qkv(x_BTD, cos, sin)
        if kv_cache is not None:
            start = kv_cache.length
            assert start + T <= kv_cache.max_len, f"KV cache full: {start} + {T} > {kv_cache.max_len}"
            kv_cache.k[layer, :, :, start:start + T] = k
            kv_cache.v[layer, :, :, start:start + T] = v
            k, v = kv_cache.k[layer, :, :, :start + T], kv_cache.v[layer, :, :, :start + T]  # fp32 views
            if T == 1:  # decode: [B, H, 1, hd] -> [B, Hkv, H / Hkv, hd], one key-padding mask row for all of them
                q = q.reshape(B, cfg.num_key_value_heads, -1, cfg.head_dim)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask) if q.dtype == torch.float32 \
                    else decode_attention(q, k, v, mask)  # fp32: torch's kernel is the faster one
                return self.o_proj(out.reshape(B, 1, -1))  # [B, Hkv, H / Hkv, hd] is already b t (h d) in memory
            k, v = k.to(q.dtype), v.to(q.dtype)  # a prefill chunk: the cached values, exactly, in q's dtype
        if kv_out is not None:
            kv_out.append((k, v))
        if prefix is not None:
            k, v = torch.cat([prefix[0], k], 2), torch.cat([prefix[1], v], 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        return self.o_proj(rearrange(out, "b h t d -> b t (h d)"))


def decode_attention(q_BHGd: torch.Tensor, k_BHSd: torch.Tensor, v_BHSd: torch.Tensor,
                     mask_B11S: torch.Tensor | None) -> torch.Tensor:
    """One new position per row against the cache (the G query heads of a KV head as G rows), with a fused
    attention kernel's numerics (FlashAttention's, and torch's CPU flash kernel's within one key block): q·k and the
    softmax in fp32, the unnormalised probabilities rounded to q's dtype before P·V, P·V accumulated in fp32 and
    divided by the softmax sum, the output rounded once to q's dtype. k, v: the cache's fp32 tensors (values of q's
    dtype). For low-precision engines: SDPA's CPU kernel spends most of a bf16 decode step converting the cache
    (4x slower at 1000 cached positions, docs/speed.md). tests/test_attention_fast.py checks it against SDPA."""
    dtype = q_BHGd.dtype
    s_BHGS = torch.matmul(q_BHGd.float() * q_BHGd.shape[-1] ** -0.5, k_BHSd.mT)
    if mask_B11S is not None:
        s_BHGS.masked_fill_(~mask_B11S, float("-inf"))
    p_BHGS = s_BHGS.sub_(s_BHGS.amax(-1, keepdim=True)).exp_()
    denom_BHG1 = p_BHGS.sum(-1, keepdim=True)
    if dtype != torch.float32:
        p_BHGS = p_BHGS.to(dtype).float()
    return torch.matmul(p_BHGS, v_BHSd).div_(denom_BHG1).to(dtype)


def attention_mask(valid_BT: torch.Tensor | None, kv_cache: KVCache | None, B: int, T: int, device):
    """Which keys each new position may attend to: causal, padded keys hidden, each position sees itself.

    None when nothing is padded and nothing is cached (SDPA's `is_causal`); [B, 1, 1, S] for one new position
    (causality is then implied: a key-padding mask); [B, 1, T, S] otherwise. S = cached + new positions.
    """
    start = 0 if kv_cache is None else kv_cache.length
    if valid_BT is None and start == 0:
        return None
    if valid_BT is None:
        valid_BT = torch.ones(B, T, dtype=torch.bool, device=device)
    if T == 1 and kv_cache is not None:
        return torch.cat([kv_cache.valid[:, :start], torch.ones_like(valid_BT)], 1)[:, None, None]
    key_valid = valid_BT if kv_cache is None else torch.cat([kv_cache.valid[:, :start], valid_BT], 1)
    q_slot = torch.arange(start, start + T, device=device)[:, None]
    k_slot = torch.arange(start + T, device=device)[None, :]
    return ((k_slot <= q_slot) & (key_valid[:, None, :] | (k_slot == q_slot)))[:, None]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        if cfg.dense:
            self.mlp = MLP(cfg.hidden_size, cfg.dense_intermediate_size)
        else:
            self.mlp = MoE(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                           cfg.norm_topk_prob)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, kv_cache, layer, replay_ids_BTK):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kv_cache, layer)
        h, ids_BTK = self.mlp(self.post_attention_layernorm(x), replay_ids_BTK)
        return x + h, ids_BTK


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(cfg.vocab_size, cfg.hidden_size),
            layers=nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers)),
            norm=RMSNorm(cfg.hidden_size, cfg.rms_norm_eps),
        ))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @torch.no_grad()
    def init_weights(self, seed: int = 0, std: float = 0.02) -> "Transformer":
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
        return self

    def forward(self, ids_BT: torch.Tensor, *, valid_BT: torch.Tensor | None = None,
                routes_BTLK: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                return_hidden: bool = False):
        cfg = self.cfg
        B, T = ids_BT.shape
        dev = ids_BT.device
        mask = attention_mask(valid_BT, kv_cache, B, T, dev)  # before valid_BT=None becomes all True
        if valid_BT is None:
            valid_BT = torch.ones(B, T, dtype=torch.bool, device=dev)
        if routes_BTLK is not None:
            if cfg.dense:
                raise RoutesError("the dense twin has no router: routes cannot be replayed into it")
            check_routes(routes_BTLK, batch=B, seq=T, num_layers=cfg.num_hidden_layers,
                         top_k=cfg.num_experts_per_tok, num_experts=cfg.num_experts)
        n_prev = torch.zeros(B, dtype=torch.long, device=dev) if kv_cache is None else kv_cache.n_valid()
        pos_BT = (n_prev[:, None] + valid_BT.long().cumsum(1) - 1).clamp(min=0)
        x = self.model.embed_tokens(ids_BT)
        cos, sin = rope_cos_sin(pos_BT, cfg.head_dim, cfg.rope_theta, x.dtype)
        used = []
        for i, layer in enumerate(self.model.layers):
            replay = None if routes_BTLK is None else routes_BTLK[:, :, i]
            x, ids_BTK = layer(x, cos, sin, mask, kv_cache, i, replay)
            used.append(ids_BTK)
        routes_out = None if cfg.dense else torch.stack(used, dim=2)
        if kv_cache is not None:
            kv_cache.commit(valid_BT, routes_out)
        x = self.model.norm(x)
        return (x if return_hidden else self.lm_head(x)), routes_out


def build_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    return Transformer(cfg).init_weights(seed)
