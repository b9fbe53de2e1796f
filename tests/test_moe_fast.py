"""What this proves: the grouped-GEMM expert path equals the dense reference (forward and the gradients of input,
router and all three expert weights; fp32 and bf16; router top-k and replay; up to 128 experts, most of them
without tokens), the per-expert loop fallback equals it too, its backward graph does not grow with the number of
experts, torch._dynamo traces one MoE block whole (no graph break, so no host sync), and the engine's small-batch
path (every expert on every token) computes the grouped path's function, taken only in bf16 under its size bound."""
import copy

import pytest
import torch

from r3.model import moe as moe_mod
from r3.model.moe import MoE, experts_dense_reference


def block(E, K, D=32, I=24, seed=0, norm_topk=True):
    torch.manual_seed(seed)
    m = MoE(D, I, E, K, norm_topk)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return m


def grads(m, x, replay, dense: bool):
    """Output and gradients of (input, router, gate, up, down) for loss Σ y·w with a fixed random w."""
    m.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    ids, gates = m.route(x, replay)
    y = (experts_dense_reference if dense else lambda ex, *a: ex(*a))(m.experts, x, ids, gates)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.dtype)
    (y.float() * w.float()).sum().backward()
    ex = m.experts
    return [y.detach()] + [t.grad.float() for t in (x, m.gate.weight, ex.gate_proj, ex.up_proj, ex.down_proj)]


def assert_close(got, want, rtol):
    names = ["y", "d x", "d router", "d gate_proj", "d up_proj", "d down_proj"]
    for name, a, b in zip(names, got, want):
        err = (a.float() - b.float()).abs().max().item()
        scale = b.float().abs().max().item()
        assert err <= rtol * scale + 1e-6, f"{name}: max-abs error {err:.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("E, K, N", [(8, 2, 40), (32, 4, 33), (128, 8, 12)])  # 128: ≥ 32 experts get no token
@pytest.mark.parametrize("replay", [False, True])
def test_grouped_path_equals_dense_reference_fp32(E, K, N, replay):
    m = block(E, K)
    x = torch.randn(N, 32)
    routes = m.gate(x).argsort(-1)[:, :K].detach() if replay else None  # experts the router ranks last
    assert_close(grads(m, x, routes, dense=False), grads(m, x, routes, dense=True), rtol=1e-5)


@pytest.mark.parametrize("replay", [False, True])
def test_grouped_path_bf16_matches_fp32_reference(replay):
    """bf16 fast path against the fp32 dense reference on the same bf16-rounded weights: bf16-level error."""
    m = block(64, 8, D=64, I=32).to(torch.bfloat16)
    ref = copy.deepcopy(m).float()
    x = torch.randn(20, 64).to(torch.bfloat16)
    if replay:  # every token on the same 8 experts, 56 experts without a token
        routes = torch.randperm(64, generator=torch.Generator().manual_seed(2))[:8].repeat(20, 1)
        got = grads(m, x, routes, dense=False)
    else:  # the bf16 router's own top-k; the reference replays those ids (same gate formula, fp32 router)
        got, routes = grads(m, x, None, dense=False), m.route(x)[0]
    assert_close(got, grads(ref, x.float(), routes, dense=True), rtol=3e-2)


def test_looped_fallback_equals_grouped(monkeypatch):
    m = block(16, 2)
    x = torch.randn(30, 32)
    fast = grads(m, x, None, dense=False)
    monkeypatch.setattr(moe_mod, "_GROUPED_MM", False)
    assert not moe_mod._grouped_mm_ok(x, m.experts.gate_proj)
    assert_close(grads(m, x, None, dense=False), fast, rtol=1e-6)


def test_shapes_grouped_mm_refuses_take_the_loop():
    """Rows of 30 fp32 values are 120 bytes, not a multiple of 16: the loop runs, same answer as the reference."""
    m = block(8, 2, D=30, I=20)
    x = torch.randn(25, 30)
    assert not moe_mod._grouped_mm_ok(x, m.experts.gate_proj)
    assert_close(grads(m, x, None, dense=False), grads(m, x, None, dense=True), rtol=1e-5)


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("E, K, N", [(8, 2, 40), (128, 8, 3)])
def test_all_experts_path_equals_grouped_path(dtype, rtol, E, K, N):
    """Same routes, same gates, same weights in the engine's dtype: only the matmul kernels differ (rounding)."""
    m = block(E, K).to(dtype)
    x = torch.randn(N, 32).to(dtype)
    with torch.no_grad():
        ids, gates = m.route(x)
        grouped = m.experts(x, ids, gates)  # not fused: always the grouped path
        got = m.experts.fuse_gate_up_()._all_experts(x, ids, gates)
    assert_close([got], [grouped], rtol)


def test_all_experts_path_is_taken_only_when_cheaper():
    ex = block(16, 2, D=128, I=96).experts.fuse_gate_up_()
    bf16, fp32 = torch.zeros(64, 128, dtype=torch.bfloat16), torch.zeros(64, 128)
    assert moe_mod.all_experts_is_cheaper(bf16, ex.gate_up_proj)  # a decode step of toy-wide at batch 64
    assert not moe_mod.all_experts_is_cheaper(fp32, ex.gate_up_proj)  # fp32 GEMMs are too slow for E/K x the flops
    assert moe_mod.all_experts_is_cheaper(fp32[:4], ex.gate_up_proj)  # ... but for a few rows (2^20 MACs)
    assert not moe_mod.all_experts_is_cheaper(fp32[:4].half(), ex.gate_up_proj)  # fp16 never, on a CPU
    assert not moe_mod.all_experts_is_cheaper(bf16.repeat(16, 1), ex.gate_up_proj)  # a prefill of 16 positions


def test_no_tokens_at_all():
    m = block(8, 2)
    y, ids = m(torch.randn(0, 1, 32))
    assert y.shape == (0, 1, 32) and ids.shape == (0, 1, 2)


def autograd_nodes(y):
    seen, todo = set(), [y.grad_fn]
    while todo:
        f = todo.pop()
        if f is not None and f not in seen:
            seen.add(f)
            todo += [g for g, _ in f.next_functions]
    return [type(f).__name__ for f in seen]


def test_backward_graph_does_not_grow_with_experts():
    """Linear cost in E: the same autograd nodes at 8 and 128 experts (no per-expert slice of the [E, ., .] weights,
    whose backward would write a zero-filled [E, ., .] gradient per expert: O(E²))."""
    counts = {}
    for E in (8, 128):
        y, _ = block(E, 2)(torch.randn(1, 10, 32))
        nodes = autograd_nodes(y)
        assert not any("Select" in n or "Unbind" in n for n in nodes), nodes
        counts[E] = sorted(nodes)
    assert counts[8] == counts[128]


def test_dynamo_traces_one_moe_block_whole():
    """fullgraph=True fails on any graph break, so on any host sync (.item(), .tolist(), data-dependent shapes).
    bf16: torch 2.13's tracing rule for grouped_mm accepts bf16 only (fp32 under compile takes the loop)."""
    import torch._dynamo
    torch._dynamo.reset()
    m = block(16, 4).to(torch.bfloat16)
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    y, ids = compiled(x)
    y_eager, ids_eager = m(x)
    assert torch.equal(y, y_eager) and torch.equal(ids, ids_eager)
    replay = ids.flip(-1)
    y2, used = compiled(x, replay)
    assert torch.equal(used, replay) and torch.equal(y2, m(x, replay)[0])
