"""Routes and samples as inference engines return them: SGLang and vLLM payloads → `EngineSample`.

Formats, as found in the engines' sources (search over public code, 2026-11):
  SGLang  `meta_info["routed_experts"]`: base64 of the flat row-major buffer of shape [seqlen - 1, num_layers, top_k]
          (python/sglang/srt/layers/moe/routed_experts_capturer.py: host buffer `torch.int32`,
          `extract_routed_experts_from_meta_info` does `np.frombuffer(pybase64.b64decode(...), dtype=np.int32)`).
          io_struct.py: `routed_experts_start_len` is the "absolute start position for returned routings; response
          covers [routed_experts_start_len, seqlen - 1). Must be in [0, prompt_tokens]". sgl-project/sglang#31219 adds
          `meta_info["routed_experts_dtype"]` in {int32, uint16, uint8}; absent means int32. sglang-jax uses -1 for
          layers without routed experts (refused here as missing routes).
  vLLM    combined `CompletionOutput.routed_experts` [P + N - 1, L, K] (vllm/outputs.py; uint8 for <= 256 experts in
          0.26, verl#7880; the last sampled token is never fed) or split, newer: `RequestOutput.prompt_routed_experts`
          [P] + `routed_experts` [N - 1] (v1/engine/output_processor.py `split_routed_experts`); the OpenAI server
          mirrors either. `vllm_routes` tells them apart by shape (P prompt, N output tokens).
Our Batch keeps routes [B, T-1, L, K] by input position, the same convention, so no final position is invented.
Slots an engine never fed get the distinct dummy ids 0..K-1, never zeros (K equal zeros is not a valid top-k set:
a known production bug): batch padding, and the last token of a row shorter than the batch (an input position in
our layout whose logits score padding). Both lie outside `loss_mask`. `sglang_sample` / `vllm_sample` build an
`EngineSample`; `r3.batch.batch_from_samples` lays samples out as a Batch exactly as `Engine.generate` does.
"""
import base64
import binascii
from dataclasses import dataclass

import torch

from r3.moe import RoutesError, check_routes

_WIRE_DTYPES = {"int32": torch.int32, "uint16": torch.uint16, "uint8": torch.uint8}


@dataclass
class EngineSample:
    """One sampled sequence from an external engine: routes [len(prompt) + len(output) - 1, L, K] by input position."""
    prompt_ids: list[int]
    output_ids: list[int]
    routes: torch.Tensor
    output_logp: list[float] | None = None
    reward: float = 0.0
    group: int = 0


def fit_routes(routes: torch.Tensor, cfg, n_tokens: int, where: str) -> torch.Tensor:
    L, K, E = cfg.num_hidden_layers, cfg.num_experts_per_tok, cfg.num_experts
    if cfg.dense:
        raise RoutesError(f"{where}: the model config is dense; it has no routes to import")
    if tuple(routes.shape) != (n_tokens - 1, L, K):
        raise RoutesError(f"{where}: routes shape {tuple(routes.shape)} but {n_tokens} tokens on a model with {L} "
                          f"layers and top-{K} need [{n_tokens - 1}, {L}, {K}] (one row per fed position)")
    try:
        check_routes(routes[None], batch=1, seq=n_tokens - 1, num_layers=L, top_k=K, num_experts=E)
    except RoutesError as e:
        raise RoutesError(f"{where}: {e}") from e
    return routes.long()


def decode_sglang_routes(meta_info: dict, cfg, *, seq_len: int, prev_routes: torch.Tensor | None = None,
                         start_len: int | None = None) -> torch.Tensor:
    """SGLang `meta_info` -> routes [seq_len - 1, L, K] (int64), validated against `cfg` (a ModelConfig).

    seq_len: prompt + output tokens. With `routed_experts_start_len` S > 0 (the request's value; read from
    meta_info when not given) the payload covers positions [S, seq_len - 1) only: `prev_routes` (an earlier turn's
    routes of the same conversation, >= S rows) supplies positions [0, S).
    """
    where = "SGLang meta_info['routed_experts']"
    if not isinstance(meta_info, dict) or meta_info.get("routed_experts") is None:
        raise RoutesError(f"{where} is missing: start the server with --enable-return-routed-experts and send "
                          f"return_routed_experts=True")
    S = meta_info.get("routed_experts_start_len", 0) if start_len is None else start_len
    if isinstance(S, bool) or not isinstance(S, int):
        raise RoutesError(f"{where}: routed_experts_start_len={S!r} ({type(S).__name__}) must be an integer "
                          f"position in [0, prompt tokens]")
    dtype_name = meta_info.get("routed_experts_dtype") or "int32"
    if dtype_name not in _WIRE_DTYPES:
        raise RoutesError(f"{where}: unknown routed_experts_dtype {dtype_name!r}; known: {sorted(_WIRE_DTYPES)}")
    try:
        raw = base64.b64decode(meta_info["routed_experts"], validate=True)
    except (binascii.Error, TypeError, ValueError) as e:
        raise RoutesError(f"{where}: not valid base64 ({e})") from e
    item = torch.empty(0, dtype=_WIRE_DTYPES[dtype_name]).element_size()
    L, K = cfg.num_hidden_layers, cfg.num_experts_per_tok
    if len(raw) % (item * L * K):
        raise RoutesError(f"{where}: {len(raw)} bytes is not a whole number of [{L}, {K}] {dtype_name} rows")
    flat = torch.frombuffer(bytearray(raw), dtype=_WIRE_DTYPES[dtype_name]) if raw else torch.zeros(0)
    new = flat.long().view(-1, L, K)
    if not 0 <= S <= seq_len - 1 or new.shape[0] != seq_len - 1 - S:
        raise RoutesError(f"{where}: {new.shape[0]} rows but positions [{S}, {seq_len - 1}) of a {seq_len}-token "
                          f"sequence need {seq_len - 1 - S} (routed_experts_start_len={S})")
    if S:
        if prev_routes is None or prev_routes.shape[0] < S:
            have = None if prev_routes is None else prev_routes.shape[0]
            raise RoutesError(f"{where}: the payload starts at position {S} (routed_experts_start_len); pass the "
                              f"earlier routes of this conversation as prev_routes (>= {S} rows, got {have})")
        new = torch.cat([prev_routes[:S].long(), new])
    return fit_routes(new, cfg, seq_len, where)


def sglang_sample(prompt_ids: list[int], response: dict, cfg, *, prev_routes: torch.Tensor | None = None,
                  start_len: int | None = None, reward: float = 0.0, group: int = 0) -> EngineSample:
    """One SGLang /generate response (`{"output_ids", "meta_info"}`) for the request's `prompt_ids`."""
    meta = response.get("meta_info", {})
    lp = meta.get("output_token_logprobs")  # [(logprob, token_id, text), ...] when return_logprob=True
    out = response.get("output_ids")
    if out is None and lp is not None:
        out = [int(x[1]) for x in lp]
    if out is None:
        raise ValueError("SGLang response has neither output_ids nor meta_info.output_token_logprobs")
    if lp is not None and len(lp) != len(out):
        raise ValueError(f"SGLang response: {len(lp)} output_token_logprobs for {len(out)} output tokens")
    routes = decode_sglang_routes(meta, cfg, seq_len=len(prompt_ids) + len(out), prev_routes=prev_routes,
                                  start_len=start_len)
    logp = None if lp is None else [float(x[0]) for x in lp]
    return EngineSample(list(prompt_ids), list(out), routes, logp, reward, group)


def vllm_routes(prompt_routes, routes, cfg, *, n_prompt: int, n_output: int, where: str) -> torch.Tensor:
    """vLLM routes of one sequence (arrays, tensors or nested lists) -> [P + N - 1, L, K] int64: combined
    (`routes` alone) or split (`prompt_routes` [P] + `routes` [N - 1], empty or None when N = 1), by shape."""
    P, N, L, K = n_prompt, n_output, cfg.num_hidden_layers, cfg.num_experts_per_tok
    pr, gen = (None if x is None else torch.as_tensor(x) for x in (prompt_routes, routes))
    if pr is None and gen is None:
        raise RoutesError(f"{where} is None: start vLLM with --enable-return-routed-experts (offline: "
                          f"enable_return_routed_experts=True)")
    for name, t in (("prompt_routed_experts", pr), ("routed_experts", gen)):
        if t is not None and t.numel() and (t.dtype.is_floating_point or t.dtype == torch.bool or t.dim() != 3):
            raise RoutesError(f"{where}: {name} must be an integer array [tokens, layers, k], got {t.dtype} "
                              f"{tuple(t.shape)}")
    rows = [None if t is None else t.shape[0] if t.numel() else 0 for t in (pr, gen)]
    if rows[0] is None and rows[1] == P + N - 1:
        return fit_routes(gen.long(), cfg, P + N, where)
    if rows[0] == P and (rows[1] or 0) == N - 1:
        parts = [t.long().reshape(-1, L, K) for t in (pr, gen) if t is not None and t.numel()]
        return fit_routes(torch.cat(parts) if parts else torch.zeros(0, L, K, dtype=torch.long), cfg, P + N, where)
    shapes = [None if t is None else list(t.shape) for t in (pr, gen)]
    raise RoutesError(f"{where}: got prompt_routed_experts {shapes[0]} + routed_experts {shapes[1]} for a {P}-token "
                      f"prompt and {N} output tokens; need either routed_experts [{P + N - 1}, L, K] alone "
                      f"(combined) or prompt_routed_experts [{P}, L, K] + routed_experts [{N - 1}, L, K] (split)")


def vllm_sample(prompt_ids: list[int], completion, cfg, *, prompt_routes=None, reward: float = 0.0,
                group: int = 0) -> EngineSample:
    """One vLLM `CompletionOutput` for `prompt_ids`; `prompt_routes`: its request's `prompt_routed_experts`."""
    out = list(completion.token_ids)
    routes = vllm_routes(prompt_routes, getattr(completion, "routed_experts", None), cfg, n_prompt=len(prompt_ids),
                         n_output=len(out), where="vLLM CompletionOutput.routed_experts")
    logp = None
    if getattr(completion, "logprobs", None):  # one {token_id: Logprob} dict per output token
        lps = completion.logprobs
        if len(lps) != len(out):
            raise ValueError(f"vLLM CompletionOutput.logprobs: {len(lps)} entries for {len(out)} output tokens")
        for i, (d, t) in enumerate(zip(lps, out)):
            if t not in d:
                raise ValueError(f"vLLM CompletionOutput.logprobs[{i}] has no entry for the sampled token {t} "
                                 f"(has {sorted(d)[:5]}); request logprobs for the sampled token")
        logp = [float(getattr(d[t], "logprob", d[t])) for d, t in zip(lps, out)]
    return EngineSample(list(prompt_ids), out, routes, logp, reward, group)
