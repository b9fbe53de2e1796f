"""The Qwen3-MoE sparse block, with route recording and Rollout Routing Replay (R3).

One block does three things:
  normal  : p = softmax(x·W_rᵀ) in fp32, I = top-k(p), g = p[I] / Σ p[I]
  record  : the ids I it used are returned, always (they are free: top-k already computed them)
  replay  : I is taken from the caller (the rollout engine's routes for R3, the old-policy pass for R2);
            the gates are still gathered from the *live* p, so the router W_r keeps its gradient.

We never gather from probabilities that a training-side top-k already zeroed: that would kill the gradient on
every replayed expert the trainer would not have picked itself.

Experts are stacked ([E, I, D] tensors) so a whole layer is three parameters. Two expert paths:
`experts_dense_reference` runs every expert on every token (obviously correct, slow); `Experts.forward` sorts
tokens by expert and runs one matmul per expert on a contiguous slice (the path everything uses).
The HF checkpoint loader stacks HF's per-expert weights into this layout.

Shape suffixes:
  N tokens (B·T flattened)   D hidden   E experts   K experts per token   I expert hidden
  B batch   T positions   L MoE layers
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class RoutesError(ValueError):
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

    def forward(self, x_ND: torch.Tensor, ids_NK: torch.Tensor, gates_NK: torch.Tensor) -> torch.Tensor:
        """y_n = Σ_k gates[n, k] · Expert_{ids[n, k]}(x_n), by sorting the N·K (token, expert) pairs by expert."""
        N, K = ids_NK.shape
        flat_ids = ids_NK.reshape(-1)
        order = flat_ids.argsort(stable=True)
        token_of_pair = order // K
        counts = torch.bincount(flat_ids, minlength=self.gate_proj.shape[0]).tolist()
        x_sorted = x_ND[token_of_pair]
        outs = []
        for e, x_e in enumerate(x_sorted.split(counts)):
            if x_e.shape[0] == 0:
                continue
            h = F.silu(x_e @ self.gate_proj[e].T) * (x_e @ self.up_proj[e].T)
            outs.append(h @ self.down_proj[e].T)
        y_sorted = torch.cat(outs) * gates_NK.reshape(-1)[order, None]
        return torch.zeros_like(x_ND).index_add_(0, token_of_pair, y_sorted)


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
