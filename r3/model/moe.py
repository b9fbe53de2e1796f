"""The Qwen3-MoE sparse block, with route recording and Rollout Routing Replay (R3).

One block does three things:
  normal  : p = softmax(x·W_rᵀ) in fp32, I = top-k(p), g = p[I] / Σ p[I]
  record  : the ids I it used are returned, always (they are free: top-k already computed them)
  replay  : I is taken from the caller (the rollout engine's routes for R3, the old-policy pass for R2);
            the gates are still gathered from the *live* p, so the router W_r keeps its gradient.

We never gather from probabilities that a training-side top-k already zeroed: that would kill the gradient on
every replayed expert the trainer would not have picked itself.

Experts are stacked ([E, I, D] tensors) so a whole layer is three parameters. Two expert paths:
`experts_dense_reference` runs every expert on every token (obviously correct, slow, for tests); `Experts.forward`
sorts the (token, expert) pairs by expert and runs one grouped GEMM per projection (`F.grouped_mm`, torch ≥ 2.10,
CPU and GPU, with autograd): no host sync, no Python loop over experts, a backward that writes each [E, ., .]
gradient once (linear in E), and `torch.compile(fullgraph=True)` traces it in bf16 (torch's tracing rule for
grouped_mm takes bf16 only). Where grouped_mm cannot run (an older torch, fp64, row strides that are not a
multiple of 16 bytes, fp32 under torch.compile) a per-expert loop does the same with one host sync.
The rollout engine's copy (gate/up fused) runs a decode step's few tokens through every expert instead
(`Experts._all_experts`): three large matmuls beat E tiny ones there, in bf16 (see `all_experts_is_cheaper`).
The HF checkpoint loader stacks HF's per-expert weights into this layout.

Shape suffixes:
  N tokens (B·T flattened)   D hidden   E experts   K experts per token   I expert hidden
  P (token, expert) pairs, N·K, sorted by expert   O a projection's output size
  B batch   T positions   L MoE layers
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from r3.errors import InputError


class RoutesError(InputError):
    """Replay routes that cannot be used as they are. The message names the problem."""


def check_routes(routes_BTLK: torch.Tensor, *, batch: int, seq: int, num_layers: int, top_k: int,
                 num_experts: int) -> None:
    """Raise RoutesError unless `routes_BTLK` is a complete, well-formed set of expert ids for this forward."""
    if not isinstance(routes_BTLK, torch.Tensor):
        raise RoutesError(f"routes must be a torch.Tensor of expert ids, got {type(routes_BTLK).__name__}")
    r = routes_BTLK
    if r.dtype == torch.bool or r.dtype.is_floating_point or r.dtype.is_complex:
        raise RoutesError(f"routes must be an integer tensor of expert ids, got dtype {r.dtype}")
    if r.dim() != 4:
        raise RoutesError(f"routes must have shape [batch, positions, layers, k] = "
                          f"[{batch}, {seq}, {num_layers}, {top_k}], got {tuple(r.shape)}")
    for name, got, want in (("batch", r.shape[0], batch), ("positions", r.shape[1], seq),
                            ("layers", r.shape[2], num_layers), ("k", r.shape[3], top_k)):
        if got != want:
            raise RoutesError(f"routes have {got} {name} but the model forward needs {want} "
                              f"(routes shape {tuple(r.shape)}, expected [{batch}, {seq}, {num_layers}, {top_k}])")
    r = r.long()
    missing = (r < 0).any(-1)
    if missing.any():
        b, t, l = missing.nonzero()[0].tolist()
        raise RoutesError(f"routes missing (negative ids) for {int(missing.sum())} (position, layer) pairs; "
                          f"first at batch {b}, position {t}, layer {l}")
    if (r >= num_experts).any():
        b, t, l, k = (r >= num_experts).nonzero()[0].tolist()
        raise RoutesError(f"expert id {int(r[b, t, l, k])} out of range [0, {num_experts}) "
                          f"at batch {b}, position {t}, layer {l}")
    srt = r.sort(-1).values
    dup = (srt[..., 1:] == srt[..., :-1]).any(-1)
    if dup.any():
        b, t, l = dup.nonzero()[0].tolist()
        raise RoutesError(f"duplicate expert ids {r[b, t, l].tolist()} within one token's top-{top_k} "
                          f"at batch {b}, position {t}, layer {l} ({int(dup.sum())} such (position, layer) pairs)")


class Experts(nn.Module):
    """E SwiGLU experts, stacked: down(silu(gate(x)) · up(x))."""

    def __init__(self, num_experts: int, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, inter, hidden))
        self.up_proj = nn.Parameter(torch.empty(num_experts, inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))
        self.gate_up_proj = None  # [E, 2I, D] once `fuse_gate_up_` ran: gate_proj and up_proj are views of it

    @torch.no_grad()
    def fuse_gate_up_(self) -> "Experts":
        """Hold gate and up in one [E, 2I, D] tensor (HF's `gate_up_proj` layout), `gate_proj` and `up_proj` becoming
        views of its halves: the forward then runs one grouped GEMM for both. For the rollout engine's copy.

        Names, state dict and values are unchanged, and writes through the two parameters (weight sync,
        `load_state_dict`) land in the fused tensor, so it cannot go stale; `.to()` re-fuses (see `_apply`).
        Each output element is the same dot product over D, so the results are bit-identical (tests/test_engine.py).
        """
        inter = self.gate_proj.shape[1]
        gate_up = torch.cat([self.gate_proj, self.up_proj], 1)
        grad = self.gate_proj.requires_grad
        self.gate_up_proj = gate_up
        self.gate_proj = nn.Parameter(gate_up[:, :inter], requires_grad=grad)
        self.up_proj = nn.Parameter(gate_up[:, inter:], requires_grad=grad)
        return self

    def _apply(self, fn, recurse=True):
        """A dtype or device move replaces each parameter's data, which would cut the views: fuse again after it."""
        out = super()._apply(fn, recurse)
        if self.gate_up_proj is not None:
            self.fuse_gate_up_()
        return out

    def forward(self, x_ND: torch.Tensor, ids_NK: torch.Tensor, gates_NK: torch.Tensor) -> torch.Tensor:
        """y_n = Σ_k gates[n, k] · Expert_{ids[n, k]}(x_n), on the N·K (token, expert) pairs sorted by expert.

        The sort, the per-expert offsets and the grouped matmuls stay on the device (no host sync). The K outputs
        of a token are put back in top-k order and summed (deterministic, unlike a scatter-add on a GPU).
        """
        if self.gate_up_proj is not None and all_experts_is_cheaper(x_ND, self.gate_up_proj):
            return self._all_experts(x_ND, ids_NK, gates_NK)
        N, K = ids_NK.shape
        E = self.gate_proj.shape[0]
        sorted_ids, order = ids_NK.reshape(-1).sort(stable=True)  # sorted pair p is flat pair order[p]
        experts_E = torch.arange(E, device=ids_NK.device, dtype=sorted_ids.dtype)
        offs_E = torch.searchsorted(sorted_ids, experts_E, right=True, out_int32=True)  # end of each expert's rows
        x_PD = x_ND[order // K]
        mm = _grouped_mm if _grouped_mm_ok(x_PD, self.gate_proj) else _looped_mm
        if self.gate_up_proj is None:
            h_PI = F.silu(mm(x_PD, self.gate_proj, offs_E)) * mm(x_PD, self.up_proj, offs_E)
        else:  # fused (the engine's copy): one GEMM for gate and up. silu of a contiguous copy, as unfused: on a
            # strided view its vectorised loop would split rows differently, and its scalar tail can round apart
            gate_PI, up_PI = mm(x_PD, self.gate_up_proj, offs_E).chunk(2, dim=-1)
            h_PI = F.silu(gate_PI.contiguous()) * up_PI
        y_PD = mm(h_PI, self.down_proj, offs_E) * gates_NK.reshape(-1)[order, None]
        y_NKD = torch.empty_like(y_PD).index_copy(0, order, y_PD).view(N, K, y_PD.shape[1])  # (token, k) order
        return y_NKD.sum(1)

    def _all_experts(self, x_ND: torch.Tensor, ids_NK: torch.Tensor, gates_NK: torch.Tensor) -> torch.Tensor:
        """The same function for a few tokens (decode): every expert on every token, as one matmul for gate/up
        (the fused [E·2I, D] weight) and one batched matmul for down, then each token's K outputs gathered.

        E/K times the flops of the grouped path, but three large kernels in place of a sort, a searchsorted, two
        grouped GEMMs of E tiny matmuls each and a scatter. Gates multiply after down and the K outputs are summed
        in top-k order, as in the grouped path, so only the matmul kernels (not the expression) differ.
        """
        N, K = ids_NK.shape
        E, I2, D = self.gate_up_proj.shape
        gate_up_ENI = F.linear(x_ND, self.gate_up_proj.view(E * I2, D)).view(N, E, I2).transpose(0, 1)
        gate_ENI, up_ENI = gate_up_ENI.chunk(2, dim=-1)
        h_ENI = F.silu(gate_ENI.contiguous()) * up_ENI
        y_END = torch.bmm(h_ENI, self.down_proj.mT)
        rows_NK = ids_NK * N + torch.arange(N, device=x_ND.device)[:, None]  # row (e, n) of y_END viewed [E·N, D]
        return (y_END.view(E * N, D).index_select(0, rows_NK.view(-1)).view(N, K, D) * gates_NK[..., None]).sum(1)


def _grouped_mm(x_PD: torch.Tensor, w_EOD: torch.Tensor, offs_E: torch.Tensor) -> torch.Tensor:
    """Rows of x in expert-sorted slices (ending at offs_E) times each expert's w.T: one grouped GEMM."""
    return F.grouped_mm(x_PD, w_EOD.mT, offs=offs_E)


def _looped_mm(x_PD: torch.Tensor, w_EOD: torch.Tensor, offs_E: torch.Tensor) -> torch.Tensor:
    """The same, one matmul per expert; for a torch without grouped_mm or shapes it refuses. One host sync.

    `unbind` (not `w[e]`) keeps the backward linear in E: one [E, O, D] gradient, not E of them.
    """
    counts = torch.diff(offs_E, prepend=offs_E.new_zeros(1)).tolist()
    outs = [x_e @ w_OD.T for x_e, w_OD in zip(x_PD.split(counts), w_EOD.unbind(0))]
    return torch.cat(outs)


_GROUPED_MM = hasattr(F, "grouped_mm")  # torch ≥ 2.10; earlier versions take the loop


def _grouped_mm_ok(x_PD: torch.Tensor, w_EOD: torch.Tensor) -> bool:
    """grouped_mm runs fp32 / bf16 / fp16 with row strides that are multiples of 16 bytes; traced, bf16 only."""
    if not _GROUPED_MM or x_PD.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if torch.compiler.is_compiling() and x_PD.dtype != torch.bfloat16:
        return False
    return all(n * x_PD.element_size() % 16 == 0 for n in w_EOD.shape[1:])


# Most multiply-adds N·E·I·D per projection for which the engine's copy runs every expert on every token: at or below
# it (decode steps; measured on one CPU thread: toy-wide at batch 64 is 1.3e7, qwen3-ratio at batch 8 is 2.5e7)
# three large bf16 GEMMs beat the grouped path's E tiny ones and its bookkeeping, even at E/K times the flops
# (qwen3-ratio at batch 64, 2.0e8, is a tie; a prefill is far above). In fp32 (MKL GEMMs, a quarter of bf16's rate
# here) the break-even is lower: the toy's decode step is 25 % faster at batch 16 (2^19), 20 % at 32, 13 % slower at
# 128 (2^22) (docs/speed.md).
ALL_EXPERTS_MAX_MACS = {torch.bfloat16: 2 ** 25, torch.float32: 2 ** 20}


def all_experts_is_cheaper(x_ND: torch.Tensor, w_EOD: torch.Tensor) -> bool:
    """bf16 and small fp32 batches; never fp16: on a CPU without native fp16 its GEMMs are slower still."""
    E, I2, D = w_EOD.shape
    return x_ND.shape[0] * E * (I2 // 2) * D <= ALL_EXPERTS_MAX_MACS.get(x_ND.dtype, -1)


def experts_dense_reference(experts: Experts, x_ND: torch.Tensor, ids_NK: torch.Tensor,
                            gates_NK: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, then a weighted sum with zero weight off the chosen set. For tests."""
    h = F.silu(torch.einsum("nd,eid->nei", x_ND, experts.gate_proj)) * torch.einsum("nd,eid->nei", x_ND,
                                                                                  experts.up_proj)
    y_NED = torch.einsum("nei,edi->ned", h, experts.down_proj)
    w_NE = torch.zeros(x_ND.shape[0], experts.gate_proj.shape[0], dtype=x_ND.dtype, device=x_ND.device)
    w_NE.scatter_(1, ids_NK, gates_NK)
    return torch.einsum("ne,ned->nd", w_NE, y_NED)


class MoE(nn.Module):
    """Router + experts. HF names: `gate` is the router (`mlp.gate.weight`), `experts` the stacked experts."""

    def __init__(self, hidden: int, inter: int, num_experts: int, top_k: int, norm_topk_prob: bool):
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden, inter)

    def route(self, x_ND: torch.Tensor, replay_ids_NK: torch.Tensor | None = None):
        """Return (ids_NK, gates_NK). Replay swaps only *which* experts; gates come from the live router."""
        probs_NE = F.softmax(self.gate(x_ND), dim=-1, dtype=torch.float32)
        if replay_ids_NK is None:
            gates_NK, ids_NK = probs_NE.topk(self.top_k, dim=-1)
        else:
            ids_NK = replay_ids_NK.long()
            gates_NK = probs_NE.gather(-1, ids_NK)
        if self.norm_topk_prob:
            gates_NK = gates_NK / gates_NK.sum(dim=-1, keepdim=True)
        return ids_NK, gates_NK.to(x_ND.dtype)

    def forward(self, x_BTD: torch.Tensor, replay_ids_BTK: torch.Tensor | None = None):
        """Return (y_BTD, ids_BTK): the output and the expert ids actually used."""
        B, T, D = x_BTD.shape
        x_ND = x_BTD.reshape(B * T, D)
        replay_NK = None if replay_ids_BTK is None else replay_ids_BTK.reshape(B * T, self.top_k)
        ids_NK, gates_NK = self.route(x_ND, replay_NK)
        y_ND = self.experts(x_ND, ids_NK, gates_NK)
        return y_ND.view(B, T, D), ids_NK.view(B, T, self.top_k)


class MLP(nn.Module):
    """The dense twin's SwiGLU MLP (HF `Qwen3MoeMLP` names)."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor, replay_ids_BTK=None):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), None
