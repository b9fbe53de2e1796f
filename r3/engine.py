"""The rollout engine: its own copy of the weights at rollout precision, KV-cache sampling, route recording.

Why a copy: real RL stacks sample with an inference engine (SGLang, vLLM) whose numerics differ from the trainer's.
Here the difference is made the way it arises there, never by injected noise:
  fp32  same numbers as the trainer, but KV-cache decode instead of one full forward (reduction order only)
  bf16  weights and activations in bfloat16 (the common serving setup; the trainer stays fp32)
  fp16  weights and activations in float16
  fp8   simulated FP8 serving: every matmul weight (attention projections, experts, lm_head) quantised to e4m3
        with one scale per tensor (per expert for the stacked experts), dequantised, and computed in bf16.
        The router, norms and embeddings stay bf16, as fp8 checkpoints usually keep them.

`generate` prefills each prompt once, expands its KV cache (and the routes stored with it) to the G samples of
its GRPO group, then decodes one token at a time. It returns a `Batch` whose `routes` hold, for every fed
position, the experts the engine's own forward chose: the thing R3 replays.
"""
import copy

import torch

from r3.batch import Batch
from r3.model import KVCache, Transformer

ROLLOUT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def fake_quant_e4m3(w: torch.Tensor) -> torch.Tensor:
    """Round-trip through float8_e4m3fn with a per-tensor scale (per leading index for stacked [E, ., .])."""
    dims = tuple(range(1, w.dim())) if w.dim() == 3 else tuple(range(w.dim()))
    scale = w.float().abs().amax(dim=dims, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return ((w.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(w.dtype)


def _is_fp8_weight(name: str) -> bool:
    """Matmul weights that fp8 serving quantises; router (`mlp.gate.`), norms and embeddings are kept."""
    return name.endswith("_proj.weight") or name.endswith("_proj") or name == "lm_head.weight"


class Engine:
    def __init__(self, model: Transformer, dtype: str = "bf16"):
        if dtype not in ROLLOUT_DTYPES:
            raise ValueError(f"unknown rollout dtype {dtype!r}; choose from {sorted(ROLLOUT_DTYPES)}")
        self.dtype_name = dtype
        self.dtype = ROLLOUT_DTYPES[dtype]
        self.model = copy.deepcopy(model).to(self.dtype).eval().requires_grad_(False)
        self.sync(model)

    @torch.no_grad()
    def sync(self, model: Transformer) -> None:
        """Weight sync trainer → engine: cast (and quantise, for fp8) the trainer's current weights."""
        src = dict(model.named_parameters())
        for name, p in self.model.named_parameters():
            w = src[name].detach().to(self.dtype)
            p.copy_(fake_quant_e4m3(w) if self.dtype_name == "fp8" and _is_fp8_weight(name) else w)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, eos_ids: tuple[int, ...], pad_id: int,
                 group_size: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, keep_logits: bool = False) -> Batch:
        cfg, G = self.model.cfg, group_size
        dev = next(self.model.parameters()).device
        P, Lp = len(prompts), max(len(p) for p in prompts)
        if Lp + max_new_tokens > cfg.max_position_embeddings:
            raise ValueError(f"prompt ({Lp}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                             f"max_position_embeddings ({cfg.max_position_embeddings})")
        prompt_PL = torch.full((P, Lp), pad_id, dtype=torch.long, device=dev)
        pvalid_PL = torch.zeros(P, Lp, dtype=torch.bool, device=dev)
        for i, p in enumerate(prompts):  # left padding: every prompt ends at column Lp-1
            prompt_PL[i, Lp - len(p):] = torch.tensor(p, dtype=torch.long)
            pvalid_PL[i, Lp - len(p):] = True

        cache = KVCache(cfg, P, Lp + max_new_tokens, self.dtype, dev)
        logits, _ = self.model(prompt_PL, valid_BT=pvalid_PL, kv_cache=cache)  # one prefill per prompt
        cache = cache.repeat_interleave(G)
        last_BV = logits[:, -1].repeat_interleave(G, dim=0)
        B = P * G
        eos = torch.tensor(list(eos_ids), dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        toks, valids, logps, all_logps = [], [], [], []
        for step in range(max_new_tokens):
            logp_BV = (last_BV.float() / temperature).log_softmax(-1)
            tok = sample(logp_BV, top_p, generator)
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            valid = ~done
            toks.append(tok)
            valids.append(valid)
            logps.append(torch.where(valid, logp_BV.gather(-1, tok[:, None])[:, 0], 0.0))
            if keep_logits:
                all_logps.append(logp_BV)
            done = done | torch.isin(tok, eos)
            if done.all() or step == max_new_tokens - 1:
                break
            logits, _ = self.model(tok[:, None], valid_BT=valid[:, None], kv_cache=cache)
            last_BV = logits[:, 0]

        N = len(toks)
        T = Lp + N
        gen_valid = torch.stack(valids, 1)
        tokens = torch.cat([prompt_PL.repeat_interleave(G, 0), torch.stack(toks, 1)], 1)
        attn_mask = torch.cat([pvalid_PL.repeat_interleave(G, 0), gen_valid], 1)
        response_mask = torch.cat([torch.zeros(B, Lp, dtype=torch.bool, device=dev), gen_valid], 1)
        rollout_logp = torch.zeros(B, T - 1, device=dev)
        rollout_logp[:, Lp - 1:] = torch.stack(logps, 1)
        assert cache.length == T - 1, (cache.length, T)
        routes = None
        if cache.routes is not None:
            routes = cache.routes[:, :T - 1].to(torch.uint8 if cfg.num_experts <= 256 else torch.int16)
        rollout_logits = None
        if keep_logits:
            rollout_logits = torch.zeros(B, T - 1, cfg.vocab_size, device=dev)
            rollout_logits[:, Lp - 1:] = torch.stack(all_logps, 1)
        meta = dict(rollout_dtype=self.dtype_name, prompt_len=Lp, group_size=G, temperature=temperature,
                    top_p=top_p, prefill_tokens_computed=P * Lp, prefill_tokens_requested=B * Lp)
        return Batch(tokens=tokens, attn_mask=attn_mask, response_mask=response_mask, rollout_logp=rollout_logp,
                     routes=routes, rewards=torch.zeros(B), group=torch.arange(P).repeat_interleave(G),
                     rollout_logits=rollout_logits, meta=meta)


def sample(logp_BV: torch.Tensor, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Sample one id per row from exp(logp), keeping the smallest top-p nucleus when top_p < 1."""
    probs = logp_BV.exp()
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        drop = sp.cumsum(-1) - sp > top_p
        probs = torch.zeros_like(probs).scatter_(-1, si, sp.masked_fill(drop, 0.0))
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
