"""Rollout weight formats: how serving engines store the weights they sample with, simulated by a round trip.

Each format maps a trainer weight to the dequantised weight the engine computes with (in bf16; activations are not
quantised, as in weight-only and W8A16 serving). Weights are [..., out, in]: the last axis is the reduction axis,
stacked experts are [E, out, in]. Which weights a format touches: the matmul weights (attention projections,
experts, lm_head); the router (`mlp.gate.weight`) only where the format says so; norms and embeddings never.

Error model per element, with a = max |w| over the scale's block (the bound the tests check):
  fp8          e4m3, one scale per tensor (per expert for stacked experts), a ↦ 448. e4m3 has 3 mantissa bits:
               relative error ≤ 2^-4 in the normal range, absolute error ≤ 2^-10 · a/448 below it (subnormals).
               The router stays bf16, as most fp8 checkpoints keep it (DeepSeek-V3, Qwen3-FP8).
  fp8-channel  e4m3 with one scale per output channel (row), as per-channel / row-wise fp8 serving does. Same
               relative bound, smaller blocks: rows with small weights keep more precision.
  fp8-router   fp8 (per tensor) with the router weight quantised too, as engines that quantise every linear layer do.
               The router's logits then move by e4m3's relative error: the strongest fp8 point on the dial.
  int4         weight-only symmetric int4 (GPTQ / AWQ / INT4-QAT style): groups of 128 along the input axis (the row
               length if smaller), scale a/7, q = clamp(round(w / scale), -8, 7). |w − ŵ| ≤ a/14.
  fp4          NVFP4-style weight-only e2m1 (values 0, ±0.5, 1, 1.5, 2, 3, 4, 6) with groups of 16 along the input
               axis, each scaled by an e4m3 number ≈ a/6 under one fp32 per-tensor scale. |w − ŵ| ≤ a/6 (half the
               widest grid gap, 4↔6, plus the scale's own e4m3 rounding).
  mxfp4        OCP MXFP4: e2m1 in groups of 32 with a power-of-two (e8m0) scale 2^(floor(log2 a) − 2); values above
               6·scale clamp to it, so |w − ŵ| ≤ a/2 at worst (the format's known clipping of the group maximum).

The routing-mismatch dial (`router_grid`, train.py / rollout.py `--router-levels N`): the engine's router weight alone
rounded to the N-point symmetric grid {-k, ..., k} x a/k, N = 2k + 1, one scale per output row (per expert);
|w − ŵ| ≤ a/(2k). N = 2^B − 1 is symmetric int-B (3: ternary int2, 7: int3, 15: int4). It replaces whatever the
format does to the router (fp8-router's e4m3) and nothing else, so the engine's routes move with N while its
experts, attention and head keep the format's numerics; the trainer never sees it. It is an amplifier of the
routing mismatch real engines have, tied to the weights (not noise), not a format any engine serves.
Left out: activation quantisation (W8A8 / W4A8), KV-cache quantisation, outlier handling (AWQ scaling, GPTQ's
error feedback); e2m1 ties round to the lower grid point rather than to even.
"""
import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
ROUTER_SUFFIX = "mlp.gate.weight"


def _amax(w: torch.Tensor, dims) -> torch.Tensor:
    return w.float().abs().amax(dim=dims, keepdim=True).clamp(min=1e-12)


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e4m3fn).float()


def fake_quant_e4m3(w: torch.Tensor) -> torch.Tensor:
    """Round-trip through float8_e4m3fn with a per-tensor scale (per leading index for stacked [E, ., .])."""
    dims = tuple(range(1, w.dim())) if w.dim() == 3 else tuple(range(w.dim()))
    scale = _amax(w, dims) / FP8_MAX
    return (_e4m3(w.float() / scale) * scale).to(w.dtype)


def fake_quant_e4m3_channel(w: torch.Tensor) -> torch.Tensor:
    """e4m3 with one scale per output channel (per row of the last two axes)."""
    scale = _amax(w, -1) / FP8_MAX
    return (_e4m3(w.float() / scale) * scale).to(w.dtype)


def _groups(w: torch.Tensor, size: int) -> tuple[torch.Tensor, int]:
    """View the last axis as groups of `size` (the row length if smaller); returns ([..., n, g] float, g)."""
    n_in = w.shape[-1]
    g = min(size, n_in)
    if n_in % g:
        raise ValueError(f"input axis {n_in} does not split into groups of {g}")
    return w.float().reshape(*w.shape[:-1], n_in // g, g), g


def fake_quant_int4(w: torch.Tensor, group: int = 128) -> torch.Tensor:
    """Symmetric int4, weight-only, one scale (a/7) per group along the input axis."""
    x, _ = _groups(w, group)
    scale = _amax(x, -1) / 7.0
    q = (x / scale).round().clamp(-8, 7)
    return (q * scale).reshape(w.shape).to(w.dtype)


def _round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 value (|x| clamped to 6), sign kept."""
    grid = E2M1_GRID.to(x.device)
    mids = (grid[1:] + grid[:-1]) / 2
    mag = grid[torch.bucketize(x.abs().clamp(max=6.0), mids)]
    return torch.where(x < 0, -mag, mag)


def fake_quant_nvfp4(w: torch.Tensor, group: int = 16) -> torch.Tensor:
    """NVFP4: e2m1 in groups of 16, each group scale an e4m3 number under one fp32 per-tensor scale."""
    x, _ = _groups(w, group)
    tensor_scale = _amax(x, tuple(range(x.dim()))) / (6.0 * FP8_MAX)
    block = _e4m3(_amax(x, -1) / 6.0 / tensor_scale).clamp(min=2.0 ** -9) * tensor_scale
    return (_round_e2m1(x / block) * block).reshape(w.shape).to(w.dtype)


def fake_quant_mxfp4(w: torch.Tensor, group: int = 32) -> torch.Tensor:
    """MXFP4: e2m1 in groups of 32 with a shared power-of-two scale 2^(floor(log2 amax) - 2)."""
    x, _ = _groups(w, group)
    scale = torch.exp2(torch.floor(torch.log2(_amax(x, -1))) - 2)
    return (_round_e2m1(x / scale) * scale).reshape(w.shape).to(w.dtype)


def router_grid(w: torch.Tensor, points: int) -> torch.Tensor:
    """Round each row to the `points`-point symmetric grid (odd, >= 3; the routing dial, see the module docstring)."""
    if points < 3 or points % 2 == 0:
        raise ValueError(f"router grid points must be odd and >= 3, got {points}")
    k = (points - 1) // 2
    scale = _amax(w, -1) / k
    return ((w.float() / scale).round().clamp(-k, k) * scale).to(w.dtype)


def is_router_weight(name: str) -> bool:
    return name.endswith(ROUTER_SUFFIX)


def is_matmul_weight(name: str) -> bool:
    """Matmul weights that quantised serving stores low-bit; router (`mlp.gate.`), norms and embeddings are not."""
    return name.endswith("_proj.weight") or name.endswith("_proj") or name == "lm_head.weight"


# format -> (quantiser, also quantise the router weight?)
FORMATS = {
    "fp8": (fake_quant_e4m3, False),
    "fp8-channel": (fake_quant_e4m3_channel, False),
    "fp8-router": (fake_quant_e4m3, True),
    "int4": (fake_quant_int4, False),
    "fp4": (fake_quant_nvfp4, False),
    "mxfp4": (fake_quant_mxfp4, False),
}


def quantise(fmt: str, name: str, w: torch.Tensor) -> torch.Tensor:
    """The weight the engine holds for parameter `name` under format `fmt` (unchanged where the format keeps it)."""
    fn, router = FORMATS[fmt]
    if is_matmul_weight(name) or (router and is_router_weight(name)):
        return fn(w)
    return w
