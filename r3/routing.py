"""Routes on the wire and on disk: exact codecs for per-(token, layer) top-k expert ids, and import from SGLang/vLLM.

A route row is the K distinct expert ids one token used at one MoE layer (ids in [0, E)). Codecs, per row:
  codec      size                    keeps order  notes
  bool_mask  E bytes                 no           one byte per expert (a torch bool mask)
  bitmask    ceil(E/8) bytes         no           the seed paper's bit-packed routing mask (8x smaller than bool)
  int32      4K bytes                yes          SGLang / vLLM / slime wire format (our import format)
  uint8      K bytes                 yes          verl's format; E <= 256; the in-memory default
  packed     K*ceil(log2 E) bits     yes          ids bit-packed into one stream (rows not byte-aligned)
  rank       ceil(log2 C(E,K)) bits  no           rank of the sorted K-set in the combinatorial number system:
                                                  rank = sum_i C(c_i, i+1) for c_0 < ... < c_{K-1}; the
                                                  information limit for an unordered set (41 bits at 128e/top-8)
Every codec round-trips exactly and is vectorised in torch (no Python loop over rows). `rank` needs numbers wider
than int64 when C(E, K) >= 2^62 (e.g. C(256, 128) ~ 2^252): it then keeps ranks as 32-bit limbs held in int64
(sums of up to K limbs cannot overflow), propagates carries limb by limb, and decodes greedily with a vectorised
binary search and multi-limb compare/borrow. Below 2^62 it uses one int64 and `searchsorted`.

Order. The engine records top-k in descending-probability order; the set codecs (bool_mask, bitmask, rank) decode
ids ascending. Replay only needs the set: gates are gathered from the live softmax at the replayed ids, so the model
output is invariant to the order of the K ids up to float summation order (tests/test_routing.py checks this).
Defaults: in memory, `uint8` ids (`routes_dtype`): decode-free replay, order kept, 1 byte per id. On disk, `rank`
(DEFAULT_FILE_CODEC): 0.64x the bytes of uint8 at 128e/top-8 and 0.16x SGLang's int32, decoded once per load.

Corrupt input is refused with RoutesError naming the problem: a length that does not match the shape, ids out of
range or duplicated, a mask row without exactly K experts, nonzero padding bits, a rank >= C(E, K).

Engine formats, as found in their sources (search over public code, 2026-11):
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
import functools
import math
from dataclasses import dataclass

import torch

from r3.moe import RoutesError, check_routes

CODECS = ("bool_mask", "bitmask", "int32", "uint8", "packed", "rank")
SET_CODECS = ("bool_mask", "bitmask", "rank")  # decode ascending ids: the set is kept, the order is not
DEFAULT_FILE_CODEC = "rank"
_LIMB = 32
_WIRE_DTYPES = {"int32": torch.int32, "uint16": torch.uint16, "uint8": torch.uint8}


def routes_dtype(num_experts: int) -> torch.dtype:
    """The in-memory dtype for expert ids: uint8 up to 256 experts, else int16 / int32."""
    return torch.uint8 if num_experts <= 256 else torch.int16 if num_experts <= 32768 else torch.int32


def id_bits(num_experts: int) -> int:
    return (num_experts - 1).bit_length()


def rank_bits(num_experts: int, top_k: int) -> int:
    return (math.comb(num_experts, top_k) - 1).bit_length()


def row_bits(codec: str, num_experts: int, top_k: int) -> int:
    """Bits one (token, layer) row takes in `codec`."""
    _check_geometry(codec, num_experts, top_k)
    return {"bool_mask": 8 * num_experts, "bitmask": 8 * -(-num_experts // 8), "int32": 32 * top_k,
            "uint8": 8 * top_k, "packed": top_k * id_bits(num_experts),
            "rank": rank_bits(num_experts, top_k)}[codec]


def encoded_nbytes(codec: str, n_rows: int, num_experts: int, top_k: int) -> int:
    """Exact payload size; `packed` and `rank` are one bit stream, padded to a byte only at its end."""
    return -(-n_rows * row_bits(codec, num_experts, top_k) // 8)


def _check_geometry(codec: str, num_experts: int, top_k: int) -> None:
    if codec not in CODECS:
        raise RoutesError(f"unknown routes codec {codec!r}; known codecs: {', '.join(CODECS)}")
    if not 1 <= top_k <= num_experts <= 65536:
        raise RoutesError(f"routes codecs need 1 <= top_k <= num_experts <= 65536, got top_k={top_k}, "
                          f"num_experts={num_experts}")
    if codec == "uint8" and num_experts > 256:
        raise RoutesError(f"codec 'uint8' holds ids < 256 but the model has {num_experts} experts")


def _check_ids(ids_NK: torch.Tensor, num_experts: int, where: str) -> torch.Tensor:
    """Raise unless every row holds K distinct ids in [0, E); return the rows sorted ascending."""
    if ids_NK.numel() == 0:
        return ids_NK
    lo, hi = int(ids_NK.min()), int(ids_NK.max())
    if lo < 0 or hi >= num_experts:
        bad = ((ids_NK < 0) | (ids_NK >= num_experts)).any(-1).nonzero()[0, 0]
        raise RoutesError(f"{where}: expert id out of range [0, {num_experts}) in row {int(bad)}: "
                          f"{ids_NK[bad].tolist()}")
    srt = ids_NK.sort(-1).values
    dup = (srt[:, 1:] == srt[:, :-1]).any(-1)
    if dup.any():
        bad = int(dup.nonzero()[0, 0])
        raise RoutesError(f"{where}: duplicate expert ids in row {bad}: {ids_NK[bad].tolist()} "
                          f"({int(dup.sum())} such rows)")
    return srt


def _bits_of(x: torch.Tensor, nbits: int) -> torch.Tensor:
    """x (int64) -> [..., nbits] uint8 bits, least significant first."""
    return ((x[..., None] >> torch.arange(nbits, dtype=torch.int64)) & 1).to(torch.uint8)


def _int_of(bits: torch.Tensor) -> torch.Tensor:
    """[..., nbits] bits (nbits <= 63) -> int64."""
    return (bits.long() << torch.arange(bits.shape[-1], dtype=torch.int64)).sum(-1)


_SHIFTS = torch.arange(8, dtype=torch.uint8)
_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """0/1 values -> bytes, 8 per byte, least significant bit first; zero padding at the very end."""
    flat = bits.reshape(-1).to(torch.uint8)
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % 8)])
    return (flat.view(-1, 8) * _BIT_WEIGHTS).sum(-1, dtype=torch.uint8)


def _byte_bits(data: torch.Tensor) -> torch.Tensor:
    """uint8 [...] -> [..., 8] bits, least significant first."""
    return (data[..., None] >> _SHIFTS) & 1


def _unpack_bits(data: torch.Tensor, nbits: int, where: str) -> torch.Tensor:
    bits = _byte_bits(data).reshape(-1)
    if bits[nbits:].any():
        raise RoutesError(f"{where}: nonzero padding bits after the last row (corrupt payload)")
    return bits[:nbits]


def _mask_to_ids(mask_NE: torch.Tensor, top_k: int, where: str) -> torch.Tensor:
    counts = mask_NE.sum(-1)
    if (counts != top_k).any():
        bad = int((counts != top_k).nonzero()[0, 0])
        raise RoutesError(f"{where}: mask row {bad} has {int(counts[bad])} experts set, expected top_k={top_k}")
    return mask_NE.nonzero()[:, 1].view(-1, top_k)  # row-major nonzero: each row's ids ascending


@functools.lru_cache(maxsize=32)
def _binom_table(num_experts: int, top_k: int) -> tuple[torch.Tensor, int]:
    """C(c, j) for c in [0, E], j in [0, K] as int64 [E+1, K+1] (one limb) or [E+1, K+1, n] 32-bit limbs."""
    nl = max(1, -(-rank_bits(num_experts, top_k) // _LIMB))
    single = rank_bits(num_experts, top_k) <= 62
    rows = [[math.comb(c, j) for j in range(top_k + 1)] for c in range(num_experts + 1)]
    if single:  # saturate: entries above 2^62 exceed every valid rank, which is all encode/searchsorted need
        return torch.tensor([[min(v, 2 ** 62) for v in r] for r in rows], dtype=torch.int64), 1
    limbs = [[[(v >> (_LIMB * i)) & (2 ** _LIMB - 1) for i in range(nl)] for v in r] for r in rows]
    return torch.tensor(limbs, dtype=torch.int64), nl


def _limbs_le(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a <= b for [N, n] little-endian limb numbers."""
    le = torch.ones(a.shape[0], dtype=torch.bool)
    for i in range(a.shape[1]):  # from the least significant limb up; higher limbs decide
        le = (a[:, i] < b[:, i]) | ((a[:, i] == b[:, i]) & le)
    return le


def _limbs_normalise(x: torch.Tensor) -> torch.Tensor:
    """Carry / borrow so that every limb is in [0, 2^32)."""
    x = x.clone()
    for i in range(x.shape[1] - 1):
        carry = torch.div(x[:, i], 2 ** _LIMB, rounding_mode="floor")
        x[:, i] -= carry * 2 ** _LIMB
        x[:, i + 1] += carry
    return x


def _rank_encode(srt_NK: torch.Tensor, num_experts: int) -> torch.Tensor:
    N, K = srt_NK.shape
    table, nl = _binom_table(num_experts, K)
    nb = rank_bits(num_experts, K)
    j = torch.arange(1, K + 1)
    if nl == 1:
        return _bits_of(table[srt_NK, j].sum(-1), nb)
    limbs = _limbs_normalise(table[srt_NK, j].sum(1))  # [N, nl]
    return _bits_of(limbs, _LIMB).reshape(N, -1)[:, :nb]


def _rank_decode(bits_NB: torch.Tensor, num_experts: int, top_k: int, where: str) -> torch.Tensor:
    N = bits_NB.shape[0]
    table, nl = _binom_table(num_experts, top_k)
    total = math.comb(num_experts, top_k)
    out = torch.empty(N, top_k, dtype=torch.int64)
    if nl == 1:
        rem = _int_of(bits_NB)
        if (rem >= total).any():
            raise RoutesError(f"{where}: rank {int(rem.max())} >= C({num_experts}, {top_k}) = {total} (corrupt)")
        for i in range(top_k - 1, -1, -1):  # greedy: largest c with C(c, i+1) <= rem
            c = torch.searchsorted(table[:num_experts, i + 1].contiguous(), rem, right=True) - 1
            out[:, i] = c
            rem = rem - table[c, i + 1]
        return out
    pad = torch.zeros(N, nl * _LIMB - bits_NB.shape[1], dtype=torch.uint8)
    rem = _int_of(torch.cat([bits_NB, pad], 1).view(N, nl, _LIMB))
    lim = torch.tensor([(total >> (_LIMB * i)) & (2 ** _LIMB - 1) for i in range(nl)]).expand(N, nl)
    if (_limbs_le(lim, rem)).any():
        raise RoutesError(f"{where}: a rank is >= C({num_experts}, {top_k}) (corrupt payload)")
    for i in range(top_k - 1, -1, -1):
        lo = torch.full((N,), i, dtype=torch.int64)
        hi = torch.full((N,), num_experts - 1, dtype=torch.int64)
        for _ in range(id_bits(num_experts) + 1):  # binary search on the multi-limb column
            mid = (lo + hi + 1) // 2
            ok = _limbs_le(table[mid, i + 1], rem)
            lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid - 1)
        out[:, i] = lo
        rem = _limbs_normalise(rem - table[lo, i + 1])
    return out


def encode_routes(ids: torch.Tensor, codec: str, num_experts: int) -> torch.Tensor:
    """Encode integer ids [..., K] into a flat uint8 payload of `encoded_nbytes(codec, rows, E, K)` bytes."""
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dim() < 1:
        raise RoutesError(f"routes to encode must be an integer tensor [..., K], got {ids.dtype} {tuple(ids.shape)}")
    K = ids.shape[-1]
    _check_geometry(codec, num_experts, K)
    ids_NK = ids.reshape(-1, K).long()
    srt = _check_ids(ids_NK, num_experts, f"encode({codec})")
    N = ids_NK.shape[0]
    if codec in ("bool_mask", "bitmask"):
        width = num_experts if codec == "bool_mask" else 8 * -(-num_experts // 8)
        mask = torch.zeros(N, width, dtype=torch.uint8).scatter_(1, ids_NK, 1)
        return mask.reshape(-1) if codec == "bool_mask" else _pack_bits(mask)
    if codec == "int32":
        return ids_NK.to(torch.int32).contiguous().view(torch.uint8).reshape(-1)
    if codec == "uint8":
        return ids_NK.to(torch.uint8).reshape(-1)
    if codec == "packed":
        return _pack_bits(_bits_of(ids_NK, id_bits(num_experts)))
    return _pack_bits(_rank_encode(srt, num_experts))


def decode_routes(data: torch.Tensor, codec: str, shape: tuple[int, ...], num_experts: int) -> torch.Tensor:
    """Inverse of `encode_routes`: a uint8 payload -> ids of `shape` (last dim K) in `routes_dtype(E)`."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 1:
        raise RoutesError(f"routes shape must end in K, got {shape}")
    K, N = shape[-1], math.prod(shape[:-1])
    _check_geometry(codec, num_experts, K)
    where = f"routes payload ({codec}, shape {list(shape)}, {num_experts} experts)"
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1:
        raise RoutesError(f"{where}: expected a flat uint8 tensor, got {getattr(data, 'dtype', type(data))}")
    want = encoded_nbytes(codec, N, num_experts, K)
    if data.numel() != want:
        raise RoutesError(f"{where}: has {data.numel()} bytes but needs exactly {want} (truncated or corrupt)")
    if codec in ("bool_mask", "bitmask"):
        if codec == "bool_mask":
            if (data > 1).any():
                raise RoutesError(f"{where}: bool mask holds values other than 0 and 1")
            mask = data.view(N, num_experts)
        else:
            mask = _byte_bits(data.view(N, -1)).reshape(N, -1)
            if mask[:, num_experts:].any():
                raise RoutesError(f"{where}: bits set beyond expert {num_experts - 1} (corrupt)")
            mask = mask[:, :num_experts]
        ids_NK = _mask_to_ids(mask, K, where)
    elif codec in ("int32", "uint8"):
        ids_NK = (data.clone().view(torch.int32) if codec == "int32" else data).view(N, K).long()  # clone: align
    elif codec == "packed":
        b = id_bits(num_experts)
        ids_NK = _int_of(_unpack_bits(data, N * K * b, where).view(N, K, b)) if b else torch.zeros(N, K).long()
    else:
        nb = rank_bits(num_experts, K)
        ids_NK = _rank_decode(_unpack_bits(data, N * nb, where).view(N, nb), num_experts, K, where)
    if codec not in SET_CODECS:
        _check_ids(ids_NK, num_experts, where)
    return ids_NK.to(routes_dtype(num_experts)).view(shape)


# ---- import from inference engines -----------------------------------------------------------------------------

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
