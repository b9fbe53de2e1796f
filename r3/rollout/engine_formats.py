"""Routes and samples as inference engines return them: SGLang and vLLM payloads → `EngineSample`.

Formats, as found in the engines' sources (search over public code, 2026-11):
  SGLang  `meta_info["routed_experts"]`: base64 of the flat row-major buffer of shape [seqlen - 1, num_layers, top_k]
          (python/sglang/srt/layers/moe/routed_experts_capturer.py: host buffer `torch.int32`,
          `extract_routed_experts_from_meta_info` does `np.frombuffer(pybase64.b64decode(...), dtype=np.int32)`).
          io_struct.py: `routed_experts_start_len` is the "absolute start position for returned routings; response
          covers [routed_experts_start_len, seqlen - 1). Must be in [0, prompt_tokens]". sgl-project/sglang#31219 adds
          `meta_info["routed_experts_dtype"]` in {int32, uint16, uint8}; absent means int32. sglang-jax uses -1 for
          layers without routed experts (refused here as missing routes).
  vLLM    `CompletionOutput.routed_experts` [P + N - 1, L, K] (vllm/outputs.py; uint8 for <= 256 experts, uint16
          above, in 0.26 (verl#7880) and 0.32; the last sampled token is never fed), on the OpenAI server as base64 of
          a .npy file (vllm/utils/serial_utils.py `numpy2base64`; tests/test_vllm_wire.py decodes vLLM's own
          encoder's output). 0.32 has no split `prompt_routed_experts` layout (the client no longer reads one).
Our Batch keeps routes [B, T-1, L, K] by input position, the same convention, so no final position is invented.
`require_routes=False` (a run that replays no routes): a payload without routes gives a sample with routes None.
Slots an engine never fed get the distinct dummy ids 0..K-1, never zeros (K equal zeros is not a valid top-k set:
a known production bug): batch padding, and the last token of a row shorter than the batch (an input position in
our layout whose logits score padding). Both lie outside `loss_mask`. `sglang_sample` / `vllm_sample` build an
`EngineSample`; `r3.rollout.batch.batch_from_samples` lays samples out as a Batch exactly as `Engine.generate` does.
"""
import base64
import binascii
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from r3.errors import InputError
from r3.model.moe import RoutesError, check_routes
from r3.runs.validate import LOGP_TOL

_WIRE_DTYPES = {"int32": torch.int32, "uint16": torch.uint16, "uint8": torch.uint8}


@dataclass
class EngineSample:
    """One sampled sequence from an external engine: routes [len(prompt) + len(output) - 1, L, K] by input position
    (None: the engine sent none)."""
    prompt_ids: list[int]
    output_ids: list[int]
    routes: torch.Tensor | None
    output_logp: list[float] | None = None
    reward: float = 0.0
    group: int = 0


def id_tensor(x, where: str) -> torch.Tensor:
    """An integer tensor from a tensor, an array or nested lists of ints; RoutesError naming `where` otherwise."""
    if x is None:
        raise RoutesError(f"{where} is None; expected expert ids [positions, layers, k]")
    try:
        t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as e:
        raise RoutesError(f"{where}: a {type(x).__name__} that is not an array of expert ids ({e})") from e
    if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
        raise RoutesError(f"{where}: expert ids must be integers, got {t.dtype}")
    return t


def routes_shaped(routes, cfg, n_tokens: int, where: str) -> torch.Tensor:
    """`routes` as int64 [n_tokens - 1, L, K] (any `id_tensor` input); the ids themselves are not checked."""
    L, K = cfg.num_hidden_layers, cfg.num_experts_per_tok
    if cfg.dense:
        raise RoutesError(f"{where}: the model config is dense; it has no routes to import")
    routes = id_tensor(routes, f"{where}: routes")
    if tuple(routes.shape) != (n_tokens - 1, L, K):
        raise RoutesError(f"{where}: routes shape {tuple(routes.shape)} but {n_tokens} tokens on a model with {L} "
                          f"layers and top-{K} need [{n_tokens - 1}, {L}, {K}] (one row per fed position)")
    return routes.long()


def fit_routes(routes, cfg, n_tokens: int, where: str) -> torch.Tensor:
    """`routes_shaped`, then every id checked (`r3.model.moe.check_routes`): in range, K distinct per position and
    layer."""
    L, K, E = cfg.num_hidden_layers, cfg.num_experts_per_tok, cfg.num_experts
    routes = routes_shaped(routes, cfg, n_tokens, where)
    try:
        check_routes(routes[None], batch=1, seq=n_tokens - 1, num_layers=L, top_k=K, num_experts=E)
    except RoutesError as e:
        raise RoutesError(f"{where}: {e}") from e
    return routes


def token_ids(x, where: str) -> list[int]:
    """A list of token ids (ints >= 0; the vocabulary is checked with the batch); InputError naming `where`."""
    if not isinstance(x, (list, tuple)) and not (isinstance(x, torch.Tensor) and x.dim() == 1):
        raise InputError(f"{where} is {'None' if x is None else type(x).__name__}, expected a list of token ids")
    ids = x.tolist() if isinstance(x, torch.Tensor) else list(x)
    bad = [i for i, t in enumerate(ids) if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0]
    if bad:
        raise InputError(f"{where}[{bad[0]}] is {ids[bad[0]]!r}, not a token id (an integer >= 0)")
    return [int(t) for t in ids]


def check_logps(values: list[float], where: str) -> list[float]:
    """Engine log-probs of the sampled tokens: each a finite number <= 0 (up to rounding); names the index."""
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise InputError(f"{where}[{i}] is {v!r}, not a log-probability")
        if not math.isfinite(v) or v > LOGP_TOL:
            raise InputError(f"{where}[{i}] is {v}: not a log-probability (finite and <= 0)")
        out.append(float(v))
    return out


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
        if prev_routes is None:
            raise RoutesError(f"{where}: the payload starts at position {S} (routed_experts_start_len); pass the "
                              f"earlier routes of this conversation as prev_routes (>= {S} rows, got None)")
        prev = id_tensor(prev_routes, f"{where}: prev_routes")
        if prev.dim() != 3 or tuple(prev.shape[1:]) != (L, K) or prev.shape[0] < S:
            raise RoutesError(f"{where}: prev_routes has shape {list(prev.shape)}; positions [0, {S}) on a model "
                              f"with {L} layers and top-{K} need [>= {S}, {L}, {K}]")
        new = torch.cat([prev[:S].long(), new])
    return fit_routes(new, cfg, seq_len, where)


def sglang_sample(prompt_ids: list[int], response: dict, cfg, *, prev_routes: torch.Tensor | None = None,
                  start_len: int | None = None, reward: float = 0.0, group: int = 0,
                  require_routes: bool = True) -> EngineSample:
    """One SGLang /generate response (`{"output_ids", "meta_info"}`) for the request's `prompt_ids`. The log-prob
    entries must be for the output tokens, in order, and be log-probabilities."""
    where = "SGLang response"
    if not isinstance(response, dict):
        raise InputError(f"{where} is {type(response).__name__}, expected the /generate JSON object "
                         f"{{'output_ids': [...], 'meta_info': {{...}}}}")
    meta = response.get("meta_info", {})
    if not isinstance(meta, dict):
        raise InputError(f"{where}: meta_info is {type(meta).__name__}, expected an object")
    prompt_ids = token_ids(prompt_ids, "prompt_ids")
    lp = meta.get("output_token_logprobs")  # [(logprob, token_id, text), ...] when return_logprob=True
    if lp is not None and (not isinstance(lp, (list, tuple)) or
                           not all(isinstance(x, (list, tuple)) and len(x) >= 2 for x in lp)):
        raise InputError(f"{where}: meta_info.output_token_logprobs must be a list of [logprob, token_id, text]")
    out = response.get("output_ids")
    if out is None and lp is not None:
        out = [x[1] for x in lp]
    if out is None:
        raise InputError(f"{where} has neither output_ids nor meta_info.output_token_logprobs")
    out = token_ids(out, f"{where}: output_ids")
    logp = None
    if lp is not None:
        if len(lp) != len(out):
            raise InputError(f"{where}: {len(lp)} output_token_logprobs for {len(out)} output tokens")
        wrong = [i for i, (x, t) in enumerate(zip(lp, out)) if x[1] != t]
        if wrong:
            i = wrong[0]
            raise InputError(f"{where}: meta_info.output_token_logprobs[{i}] is for token {lp[i][1]!r} but "
                             f"output_ids[{i}] is {out[i]} ({len(wrong)} of {len(out)} disagree)")
        logp = check_logps([x[0] for x in lp], f"{where}: meta_info.output_token_logprobs logprob")
    routes = None if meta.get("routed_experts") is None and not require_routes else decode_sglang_routes(
        meta, cfg, seq_len=len(prompt_ids) + len(out), prev_routes=prev_routes, start_len=start_len)
    return EngineSample(prompt_ids, out, routes, logp, reward, group)


def vllm_routes(routes, cfg, *, n_prompt: int, n_output: int, where: str, required: bool = True):
    """vLLM routes of one sequence (an array, a tensor or nested lists) -> [P + N - 1, L, K] int64, checked; None
    when the engine sent none and they are not `required`."""
    if routes is None:
        if not required:
            return None
        raise RoutesError(f"{where} is None: start vLLM with --enable-return-routed-experts (offline: "
                          f"enable_return_routed_experts=True)")
    P, N, t = n_prompt, n_output, torch.as_tensor(routes)
    if t.numel() and (t.dtype.is_floating_point or t.dtype == torch.bool or t.dim() != 3):
        raise RoutesError(f"{where}: routed_experts must be an integer array [tokens, layers, k], got {t.dtype} "
                          f"{tuple(t.shape)}")
    if t.dim() != 3 or t.shape[0] != P + N - 1:
        raise RoutesError(f"{where}: routed_experts {list(t.shape)} for a {P}-token prompt and {N} output tokens; "
                          f"need [{P + N - 1}, L, K] (every fed position: prompt and output, not the last token)")
    return fit_routes(t.long(), cfg, P + N, where)


def vllm_sample(prompt_ids: list[int], completion, cfg, *, reward: float = 0.0, group: int = 0) -> EngineSample:
    """One vLLM `CompletionOutput` for `prompt_ids`."""
    if getattr(completion, "token_ids", None) is None:
        raise InputError(f"vLLM completion is {type(completion).__name__} without token_ids, expected a "
                         f"CompletionOutput")
    prompt_ids = token_ids(prompt_ids, "prompt_ids")
    out = token_ids(completion.token_ids, "vLLM CompletionOutput.token_ids")
    routes = vllm_routes(getattr(completion, "routed_experts", None), cfg, n_prompt=len(prompt_ids),
                         n_output=len(out), where="vLLM CompletionOutput.routed_experts")
    logp = None
    if getattr(completion, "logprobs", None):  # one {token_id: Logprob} dict per output token
        lps = completion.logprobs
        if len(lps) != len(out):
            raise InputError(f"vLLM CompletionOutput.logprobs: {len(lps)} entries for {len(out)} output tokens")
        for i, (d, t) in enumerate(zip(lps, out)):
            if not isinstance(d, Mapping):
                raise InputError(f"vLLM CompletionOutput.logprobs[{i}] is {d!r}, not a {{token_id: Logprob}} dict "
                                 f"for output token {i} (id {t}); request logprobs for every sampled token")
            if t not in d:
                raise InputError(f"vLLM CompletionOutput.logprobs[{i}] has no entry for the sampled token {t} "
                                 f"(has {sorted(d)[:5]}); request logprobs for the sampled token")
        logp = check_logps([getattr(d[t], "logprob", d[t]) for d, t in zip(lps, out)],
                           "vLLM CompletionOutput.logprobs (sampled token)")
    return EngineSample(prompt_ids, out, routes, logp, reward, group)
