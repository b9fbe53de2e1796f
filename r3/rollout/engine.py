"""The rollout engine: its own copy of the weights at rollout precision, KV-cache sampling, route recording.

Why a copy: real RL stacks sample with an inference engine (SGLang, vLLM) whose numerics differ from the trainer's.
Here the difference is made the way it arises there, never by injected noise:
  fp32  same numbers as the trainer, but KV-cache decode instead of one full forward (reduction order only)
  bf16  weights and activations in bfloat16 (the common serving setup; the trainer stays fp32)
  fp16  weights and activations in float16
  fp8   simulated FP8 serving: every matmul weight (attention projections, experts, lm_head) quantised to e4m3
        with one scale per tensor (per expert for the stacked experts), dequantised, and computed in bf16.
        The router, norms and embeddings stay bf16, as fp8 checkpoints usually keep them.
  fp8-channel, fp8-router, int4, fp4 (NVFP4), mxfp4: the other low-bit serving formats, each a weight round trip
        computed in bf16; their error models are in `r3/model/quant.py`.
  router_levels=N (any dtype): the routing-mismatch dial, the engine's router weight alone rounded per row to an
        N-point grid (`r3.model.quant.router_grid`), in place of what the dtype does to the router. An amplifier.

`generate` prefills each prompt once, expands its KV cache (and the routes stored with it) to the G samples of
its GRPO group, then decodes one token at a time. It returns a `Batch` whose `routes` hold, for every fed
position, the experts the engine's own forward chose: the thing R3 replays.
`continue_generation` adds a turn to a conversation held in a KV cache: earlier positions' K/V and routes are reused,
only the new positions are computed (SGLang's `routed_experts_start_len` plays this role there).
"""
import copy
import dataclasses
import functools

import torch

from r3.rollout.batch import Batch
from r3.model.model import Attention, KVCache, Transformer
from r3.model.moe import Experts
from r3.model.quant import FORMATS, is_router_weight, quantise, router_grid

ROLLOUT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                  **{fmt: torch.bfloat16 for fmt in FORMATS}}  # low-bit formats: dequantised weights, bf16 compute


def _inference(fn):
    """Run an engine call under `torch.inference_mode` (less bookkeeping per op than no_grad, the same numbers: ~10 %
    of a toy decode step), then hand its Batch out as ordinary tensors, which the trainer's autograd can take (an
    inference tensor cannot be saved for backward). A returned KVCache stays an inference tensor: only the engine
    reads it again, inside inference mode."""
    @functools.wraps(fn)
    def call(*args, **kw):
        with torch.inference_mode():
            out = fn(*args, **kw)
        if isinstance(out, tuple):
            return ordinary(out[0]), out[1]
        return ordinary(out)
    return call


def ordinary(batch: Batch) -> Batch:
    """A copy of `batch` whose tensors are ordinary ones (cloned outside inference mode)."""
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name).clone() for f in dataclasses.fields(batch)
                                         if isinstance(getattr(batch, f.name), torch.Tensor)})


class Engine:
    def __init__(self, model: Transformer, dtype: str = "bf16", router_levels: int | None = None):
        if dtype not in ROLLOUT_DTYPES:
            raise ValueError(f"unknown rollout dtype {dtype!r}; choose from {sorted(ROLLOUT_DTYPES)}")
        if router_levels is not None and model.cfg.dense:
            raise ValueError("router_levels rounds the router weight; a dense model has no router")
        self.router_levels = router_levels
        self.dtype_name = dtype
        self.dtype = ROLLOUT_DTYPES[dtype]
        self.model = copy.deepcopy(model).to(self.dtype).eval().requires_grad_(False)
        for m in self.model.modules():  # one GEMM for q/k/v and one for gate/up; same numbers, same state dict
            if isinstance(m, Attention):
                m.fuse_qkv_()
            elif isinstance(m, Experts):
                m.fuse_gate_up_()
        self.sync(model)

    @torch.no_grad()
    def sync(self, model: Transformer) -> None:
        """Weight sync trainer → engine: cast (and quantise, for the low-bit formats) the trainer's current
        weights; with router_levels, the router weight is rounded from the trainer's fp32 weight instead."""
        src = dict(model.named_parameters())
        for name, p in self.model.named_parameters():
            if self.router_levels is not None and is_router_weight(name):
                p.copy_(router_grid(src[name].detach().float(), self.router_levels).to(self.dtype))
                continue
            w = src[name].detach().to(self.dtype)
            p.copy_(quantise(self.dtype_name, name, w) if self.dtype_name in FORMATS else w)

    @_inference
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, eos_ids: tuple[int, ...], pad_id: int,
                 group_size: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, keep_logp_V: bool = False, record_routes: bool = True,
                 return_cache: bool = False):
        """Sample responses; returns a Batch, or (Batch, KVCache) with `return_cache` (for `continue_generation`).

        temperature=0 decodes greedily (argmax, top_p unused); its `rollout_logp` are of the untempered softmax.

        record_routes=False keeps no routes (batch.routes None): only to measure what recording costs.
        """
        cfg, G = self.model.cfg, group_size
        dev = next(self.model.parameters()).device
        P, Lp = len(prompts), max(len(p) for p in prompts)
        if Lp + max_new_tokens > cfg.max_position_embeddings:
            raise ValueError(f"prompt ({Lp}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                             f"max_position_embeddings ({cfg.max_position_embeddings})")
        prompt_PL, pvalid_PL = left_pad(prompts, pad_id, dev)

        cache = KVCache(cfg, P, Lp + max_new_tokens, self.dtype, dev)
        if not record_routes:
            cache.routes = None
        logits, _ = self.model(prompt_PL, valid_BT=pvalid_PL, kv_cache=cache)  # one prefill per prompt
        cache = cache.repeat_interleave(G)
        last_BV = logits[:, -1].repeat_interleave(G, dim=0)
        B = P * G
        toks, gen_valid, logps, all_logps = self._sample_loop(cache, last_BV, max_new_tokens, eos_ids, pad_id,
                                                              temperature, top_p, generator, keep_logp_V)
        N = toks.shape[1]
        T = Lp + N
        tokens = torch.cat([prompt_PL.repeat_interleave(G, 0), toks], 1)
        attn_mask = torch.cat([pvalid_PL.repeat_interleave(G, 0), gen_valid], 1)
        response_mask = torch.cat([torch.zeros(B, Lp, dtype=torch.bool, device=dev), gen_valid], 1)
        rollout_logp = torch.zeros(B, T - 1, device=dev)
        rollout_logp[:, Lp - 1:] = logps
        assert cache.length == T - 1, (cache.length, T)
        routes = None
        if cache.routes is not None:
            routes = cache.routes[:, :T - 1].clone()  # already the Batch's dtype (KVCache stores routes_dtype)
        rollout_logp_V = None
        if keep_logp_V:
            rollout_logp_V = torch.zeros(B, T - 1, cfg.vocab_size, device=dev)
            rollout_logp_V[:, Lp - 1:] = all_logps
        meta = dict(rollout_dtype=self.dtype_name, prompt_len=Lp, group_size=G, temperature=temperature,
                    top_p=top_p, prefill_tokens_computed=P * Lp, prefill_tokens_requested=B * Lp,
                    num_experts=None if cfg.dense else cfg.num_experts)
        if self.router_levels is not None:
            meta["router_levels"] = self.router_levels
        batch = Batch(tokens=tokens, attn_mask=attn_mask, response_mask=response_mask, rollout_logp=rollout_logp,
                      routes=routes, rewards=torch.zeros(B), group=torch.arange(P).repeat_interleave(G),
                      rollout_logp_V=rollout_logp_V, meta=meta)
        return (batch, cache) if return_cache else batch

    @_inference
    def continue_generation(self, batch: Batch, cache: KVCache, turns: list[list[int]], *, max_new_tokens: int,
                            eos_ids: tuple[int, ...], pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                            generator: torch.Generator | None = None, return_cache: bool = False):
        """Multi-turn: append each row's next-turn tokens to an existing conversation and sample the next response.

        `batch`, `cache` come from `generate(..., return_cache=True)` (or an earlier call of this). Earlier turns'
        K/V and routes are reused from the cache; only new positions are computed: each row's last sampled token
        (never fed yet) and its `turns[i]` tokens, one prefill chunk [B, 1 + max turn length] (left padded), like
        SGLang's `routed_experts_start_len`. The returned Batch covers the whole conversation; `response_mask`
        marks every sampled response, not the turn tokens. meta counts prefill slots: computed (the new chunk),
        requested (what a fresh prefill of the conversation would compute), reused (requested - computed).
        The cache is appended to (grown by copy when full): continue from the (batch, cache) pair returned last.
        Rewards restart at 0 and rollout_logp_V are not kept.
        """
        cfg, dev = self.model.cfg, batch.tokens.device
        B, T = batch.tokens.shape
        if len(turns) != B or any(len(t) == 0 for t in turns):
            raise ValueError(f"continue_generation needs one non-empty list of new tokens per row: {B} rows, got "
                             f"{len(turns)} lists of lengths {[len(t) for t in turns]}")
        if cache.length != T - 1 or cache.valid.shape[0] != B:
            raise ValueError(f"cache holds {cache.length} positions x {cache.valid.shape[0]} rows but the batch has "
                             f"{B} rows of {T} tokens: pass the cache returned with this batch")
        turn_BC, tvalid_BC = left_pad(turns, pad_id, dev)
        chunk_BC = torch.cat([batch.tokens[:, -1:], turn_BC], 1)  # the last sampled token was never fed
        cvalid_BC = torch.cat([batch.attn_mask[:, -1:], tvalid_BC], 1)
        C = chunk_BC.shape[1]
        if T - 1 + C + max_new_tokens > cfg.max_position_embeddings:
            raise ValueError(f"conversation ({T - 1 + C}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                             f"max_position_embeddings ({cfg.max_position_embeddings})")
        cache = cache.grow(T - 1 + C + max_new_tokens)
        logits, _ = self.model(chunk_BC, valid_BT=cvalid_BC, kv_cache=cache)
        toks, gen_valid, logps, _ = self._sample_loop(cache, logits[:, -1], max_new_tokens, eos_ids, pad_id,
                                                      temperature, top_p, generator, False)
        tokens = torch.cat([batch.tokens, chunk_BC[:, 1:], toks], 1)
        attn_mask = torch.cat([batch.attn_mask, cvalid_BC[:, 1:], gen_valid], 1)
        no_resp = torch.zeros(B, C - 1, dtype=torch.bool, device=dev)
        response_mask = torch.cat([batch.response_mask, no_resp, gen_valid], 1)
        rollout_logp = torch.cat([batch.rollout_logp, torch.zeros(B, C - 1, device=dev), logps], 1)
        Tn = tokens.shape[1]
        assert cache.length == Tn - 1 and rollout_logp.shape[1] == Tn - 1, (cache.length, Tn, rollout_logp.shape)
        routes = None if cache.routes is None else cache.routes[:, :Tn - 1].clone()
        meta = dict(batch.meta, turns=batch.meta.get("turns", 1) + 1, prefill_tokens_computed=B * C,
                    prefill_tokens_requested=B * (T - 1 + C), prefill_tokens_reused=B * (T - 1))
        out = Batch(tokens=tokens, attn_mask=attn_mask, response_mask=response_mask, rollout_logp=rollout_logp,
                    routes=routes, rewards=torch.zeros(B), group=batch.group, meta=meta)
        return (out, cache) if return_cache else out

    def _sample_loop(self, cache, last_BV, max_new_tokens, eos_ids, pad_id, temperature, top_p, generator,
                     keep_logp_V):
        """Decode one token at a time from `last_BV`; returns (tokens, valid, logp, full logp or None), each [B, N].
        temperature 0: argmax, log-probs of the untempered softmax. With top_p < 1 the token is drawn from the
        nucleus but its log-prob is that of the whole tempered softmax, the distribution the trainer scores
        (`r3.train.score.token_logp`), so the importance ratios compare like with like; the nucleus's own truncation is
        not corrected for (keep top_p 1 for RL, as the defaults do)."""
        B, dev = last_BV.shape[0], last_BV.device
        eos = torch.tensor(list(eos_ids), dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        toks, valids, logps, all_logps = [], [], [], []
        for step in range(max_new_tokens):
            logp_BV = (last_BV.float() / (temperature or 1.0)).log_softmax(-1)  # greedy: the untempered softmax
            tok = logp_BV.argmax(-1) if temperature == 0 else sample(logp_BV, top_p, generator)
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            valid = ~done
            toks.append(tok)
            valids.append(valid)
            logps.append(torch.where(valid, logp_BV.gather(-1, tok[:, None])[:, 0], 0.0))
            if keep_logp_V:
                all_logps.append(logp_BV)
            done = done | torch.isin(tok, eos)
            if done.all() or step == max_new_tokens - 1:
                break
            logits, _ = self.model(tok[:, None], valid_BT=valid[:, None], kv_cache=cache)
            last_BV = logits[:, 0]
        full = torch.stack(all_logps, 1) if keep_logp_V else None
        return torch.stack(toks, 1), torch.stack(valids, 1), torch.stack(logps, 1), full


def left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [B, Lmax], valid [B, Lmax]), left padded so every sequence ends at the last column."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros(len(seqs), L, dtype=torch.bool, device=device)
    for i, s in enumerate(seqs):
        if s:
            ids[i, L - len(s):] = torch.tensor(s, dtype=torch.long)
            valid[i, L - len(s):] = True
    return ids, valid


def sample(logp_BV: torch.Tensor, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Sample one id per row from exp(logp), keeping the smallest top-p nucleus when top_p < 1."""
    probs = logp_BV.exp()
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        drop = sp.cumsum(-1) - sp > top_p
        probs = torch.zeros_like(probs).scatter_(-1, si, sp.masked_fill(drop, 0.0))
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
