"""Routes on the wire and on disk: exact codecs for per-(token, layer) top-k expert ids.

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

Engine formats (SGLang `routed_experts`, vLLM's combined and split layouts) are read by `r3/rollout/engine_formats.py`.
"""
import functools
import math

import torch

from r3.model.moe import RoutesError

CODECS = ("bool_mask", "bitmask", "int32", "uint8", "packed", "rank")
SET_CODECS = ("bool_mask", "bitmask", "rank")  # decode ascending ids: the set is kept, the order is not
DEFAULT_FILE_CODEC = "rank"
_LIMB = 32


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
