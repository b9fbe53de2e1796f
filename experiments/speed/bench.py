"""The speed study's measurements of ours against transformers (MoE block, train step, generation, scaling) and of
the engine's kernels (decode forward, old against new; the torch.compile probe), with the clock and the interleaving
every section shares. experiments/speed/__main__.py runs them and writes the tables.
"""
import contextlib
import dataclasses
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # the reference: pip install -e .[test]
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from experiments.legacy import legacy
from r3.rollout.engine import Engine
from r3.scale.hf import save_pretrained
from r3.model.model import PRESETS, KVCache, ModelConfig, build_model
import r3.model.moe
from r3.model.moe import MoE

# Qwen3-30B-A3B's ratios (hidden 2048, 32/4 heads of 128, 128 experts top-8 of width 768) at 1/8 the width
QWEN3_RATIO = ModelConfig(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                          num_key_value_heads=1, head_dim=64, moe_intermediate_size=96, num_experts=128,
                          num_experts_per_tok=8, max_position_embeddings=512)
CONFIGS = {"toy": PRESETS["toy"], "toy-wide": PRESETS["toy-wide"], "qwen3-ratio": QWEN3_RATIO}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Clock:
    """CPU time of this process on CPU (one torch thread); wall time after a synchronize on CUDA."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def __call__(self, fn) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            return time.perf_counter() - t0
        t0 = time.process_time()
        fn()
        return time.process_time() - t0


def interleaved(clock: Clock, arms: dict, reps: int) -> dict:
    """Median seconds per arm; one untimed warm-up round, then `reps` rounds, the arm order reversed every round."""
    times = {k: [] for k in arms}
    for rep in range(reps + 1):
        order = list(arms) if rep % 2 else list(arms)[::-1]
        for name in order:
            dt = clock(arms[name])
            if rep:
                times[name].append(dt)
    return {k: statistics.median(v) for k, v in times.items()}


def hf_twin(model, dtype: torch.dtype, tmp: str) -> Qwen3MoeForCausalLM:
    """transformers' model with our model's weights: through an HF checkpoint on disk, as a user would load it."""
    path = os.path.join(tmp, f"ckpt-{id(model)}")
    if not os.path.exists(path):
        save_pretrained(model, path)
    return Qwen3MoeForCausalLM.from_pretrained(path, dtype=dtype)


def hf_moe_block(ours: MoE, hidden: int, inter: int, E: int, K: int) -> Qwen3MoeSparseMoeBlock:
    """transformers' sparse MoE block (grouped_mm experts, fused gate_up [E, 2I, D]) with `ours`' weights."""
    cfg = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=E, num_experts_per_tok=K,
                         norm_topk_prob=ours.norm_topk_prob)
    cfg._experts_implementation = "grouped_mm"  # what from_pretrained picks by default in transformers 5.x
    block = Qwen3MoeSparseMoeBlock(cfg)
    ex = ours.experts
    with torch.no_grad():
        block.gate.weight.copy_(ours.gate.weight)
        block.experts.gate_up_proj.copy_(torch.cat([ex.gate_proj, ex.up_proj], 1))
        block.experts.down_proj.copy_(ex.down_proj)
    return block


def bench_moe(args, clock, dev) -> list[dict]:
    rows = []
    D, I, K = args.moe_hidden, args.moe_inter, args.moe_top_k
    combos = [(dt, N, E) for dt in args.moe_dtypes for N in args.moe_tokens for E in args.moe_experts]
    for dt_name, N, E in tqdm(combos, desc="moe block", leave=False):
        dt = DTYPES[dt_name]
        torch.manual_seed(0)
        ours = MoE(D, I, E, K, norm_topk_prob=True)
        for p in ours.parameters():
            torch.nn.init.normal_(p, std=0.02)
        theirs = hf_moe_block(ours, D, I, E, K).to(dev, dt)
        ours = ours.to(dev, dt)
        x = torch.randn(1, N, D, device=dev, dtype=dt, requires_grad=True)
        grad = torch.randn(1, N, D, device=dev, dtype=dt)
        with torch.no_grad():
            y_ours, routes = ours(x)
            diff = (y_ours.float() - theirs(x).float()).abs().max().item()

        def step(block, *replay):
            def run():
                block.zero_grad(set_to_none=True)
                x.grad = None
                y = block(x, *replay)
                (y[0] if block is ours else y).backward(grad)
            return run

        t = interleaved(clock, dict(ours=step(ours, None), replay=step(ours, routes), hf=step(theirs)), args.reps)
        rows.append(dict(dtype=dt_name, experts=E, top_k=K, hidden=D, inter=I, tokens=N, ours_ms=t["ours"] * 1e3,
                         replay_ms=t["replay"] * 1e3, hf_ms=t["hf"] * 1e3, ratio=t["ours"] / t["hf"],
                         replay_ratio=t["replay"] / t["hf"], max_abs_diff=diff))
    return rows


def train_step(model, ids, valid, routes=None, hf=False):
    model.zero_grad(set_to_none=True)
    if hf:
        logits = model(input_ids=ids[:, :-1], attention_mask=valid[:, :-1].long()).logits
    else:
        logits = model(ids[:, :-1], valid_BT=valid[:, :-1], routes_BTLK=routes)[0]
    F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten()).backward()


def batch(cfg, B, T, dev, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g).to(dev)
    return ids, torch.ones(B, T + 1, dtype=torch.bool, device=dev)


def bench_train(args, clock, dev, tmp, shapes) -> list[dict]:
    """shapes: (config name, B, T) triples; ours top-k, ours replay, transformers, fp32 (the trainer's dtype)."""
    rows, models = [], {}
    for name, B, T in tqdm(shapes, desc="train step", leave=False):
        cfg = CONFIGS[name]
        if name not in models:
            ours = build_model(cfg, 0).init_weights(0, std=0.05)
            theirs = hf_twin(ours, torch.float32, tmp).to(dev).train()
            models[name] = ours.to(dev), theirs
        ours, theirs = models[name]
        ids, valid = batch(cfg, B, T, dev)
        with torch.no_grad():
            logits, routes = ours(ids[:, :-1], valid_BT=valid[:, :-1])
            diff = (logits - theirs(input_ids=ids[:, :-1]).logits).abs().max().item()
        t = interleaved(clock, dict(ours=lambda: train_step(ours, ids, valid),
                                    replay=lambda: train_step(ours, ids, valid, routes),
                                    hf=lambda: train_step(theirs, ids, valid, hf=True)), args.reps)
        rows.append(dict(config=name, batch=B, seq=T, ours_ms=t["ours"] * 1e3, replay_ms=t["replay"] * 1e3,
                         hf_ms=t["hf"] * 1e3, ratio=t["ours"] / t["hf"], replay_ratio=t["replay"] / t["hf"],
                         fp32_logit_max_abs_diff=diff))
    return rows


def bench_generate(args, clock, dev, tmp) -> list[dict]:
    rows = []
    combos = [(c, B, d) for c in args.configs for B in args.gen_batch for d in args.dtypes]
    cache = {}
    for name, B, dt_name in tqdm(combos, desc="generate", leave=False):
        cfg, dt, N = CONFIGS[name], DTYPES[dt_name], args.new_tokens
        if name not in cache:
            cache[name] = build_model(cfg, 0).init_weights(0, std=0.05)
        model = cache[name]
        theirs = hf_twin(model, dt, tmp).to(dev).eval()
        engine = Engine(model.to(dev), dt_name)
        ids, _ = batch(cfg, B, args.prompt_len - 1, dev, seed=1)
        prompts = ids.tolist()
        pad = cfg.vocab_size - 1

        def ours_gen():
            b = engine.generate(prompts, max_new_tokens=N, eos_ids=(), pad_id=pad,
                                generator=torch.Generator(device=dev).manual_seed(0))
            assert b.routes is not None and b.tokens.shape[1] == args.prompt_len + N

        def hf_gen():
            with torch.no_grad():
                out = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N,
                                      min_new_tokens=N, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                                      pad_token_id=pad, eos_token_id=pad)
            assert out.shape[1] == args.prompt_len + N

        t = interleaved(clock, dict(ours=ours_gen, hf=hf_gen), args.reps)
        ours_tps, hf_tps = B * N / t["ours"], B * N / t["hf"]
        rows.append(dict(config=name, batch=B, dtype=dt_name, prompt_len=args.prompt_len, new_tokens=N,
                         ours_tok_s=ours_tps, hf_tok_s=hf_tps, speedup=ours_tps / hf_tps))
    return rows



DECODE_SHAPES = [("fp8-router", 16, 100), ("fp8-router", 16, 1000), ("fp8-router", 128, 40), ("fp32", 16, 100),
                 ("fp32", 32, 100), ("fp32", 128, 40)]  # (engine dtype, rows, cached positions)


def bench_decode(args, clock) -> list[dict]:
    """One decode forward of the toy's engine copy with the old kernels and the new, alternated."""
    cfg = dataclasses.replace(PRESETS["toy"], vocab_size=80, max_position_embeddings=1100)
    model = build_model(cfg)
    rows, n = [], 2 if args.quick else 20
    shapes = DECODE_SHAPES[:1] if args.quick else DECODE_SHAPES
    for dtype, B, S in shapes:
        engine = Engine(model, dtype)
        tok = torch.randint(0, cfg.vocab_size, (B, 1), generator=torch.Generator().manual_seed(0))
        valid = torch.ones(B, 1, dtype=torch.bool)

        def steps(old: bool):
            def run():
                cache = KVCache(cfg, B, S + n, engine.dtype)
                cache.valid[:, :S] = True
                cache.length = S
                with torch.inference_mode(), (legacy() if old else contextlib.nullcontext()):
                    for _ in range(n):
                        engine.model(tok, valid_BT=valid, kv_cache=cache)
            return run
        t = interleaved(clock, {"old": steps(True), "new": steps(False)}, args.reps)
        rows.append(dict(dtype=dtype, rows=B, cached=S, old_ms=t["old"] / n * 1e3, new_ms=t["new"] / n * 1e3,
                         speedup=t["old"] / t["new"]))
    return rows


# fp32 grouped_mm as opaque ops for the compile probe: torch's tracing rule takes bf16 only, so the compiler sees
# these two as calls it cannot look into, and the rest of the forward and backward compiles as one graph.
@torch.library.custom_op("r3_speed::grouped_mm", mutates_args=())
def opaque_grouped_mm(x_PD: torch.Tensor, w_EOD: torch.Tensor, offs_E: torch.Tensor) -> torch.Tensor:
    return F.grouped_mm(x_PD, w_EOD.mT, offs=offs_E)


@opaque_grouped_mm.register_fake
def _(x_PD, w_EOD, offs_E):
    return x_PD.new_empty(x_PD.shape[0], w_EOD.shape[1])


@torch.library.custom_op("r3_speed::grouped_mm_backward", mutates_args=())
def opaque_grouped_mm_backward(x_PD: torch.Tensor, w_EOD: torch.Tensor, offs_E: torch.Tensor,
                               g_PO: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dw) of y = grouped_mm(x, w.mT): each expert's rows of g times its w, and g's rows' outer
    products with x summed within each expert."""
    return F.grouped_mm(g_PO, w_EOD, offs=offs_E), F.grouped_mm(g_PO.t(), x_PD, offs=offs_E)


@opaque_grouped_mm_backward.register_fake
def _(x_PD, w_EOD, offs_E, g_PO):
    return torch.empty_like(x_PD), torch.empty_like(w_EOD)


def _save(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, g_PO):
    return (*opaque_grouped_mm_backward(*ctx.saved_tensors, g_PO.contiguous()), None)


opaque_grouped_mm.register_autograd(_backward, setup_context=_save)


@contextlib.contextmanager
def opaque_experts():
    """r3.model.moe's expert path with fp32 grouped_mm as the opaque ops above, also while compiling."""
    saved = r3.model.moe._grouped_mm, r3.model.moe._grouped_mm_ok
    r3.model.moe._grouped_mm = opaque_grouped_mm
    r3.model.moe._grouped_mm_ok = lambda x_PD, w_EOD: all(n * x_PD.element_size() % 16 == 0 for n in w_EOD.shape[1:])
    try:
        yield
    finally:
        r3.model.moe._grouped_mm, r3.model.moe._grouped_mm_ok = saved


@contextlib.contextmanager
def _env(**values):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def bench_compile(args, clock) -> list[dict]:
    """The trainer's forward + backward (the toy, fp32): eager, compiled as is, compiled with opaque grouped_mm."""
    cfg = dataclasses.replace(PRESETS["toy"], vocab_size=80)
    B, T = (2, 8) if args.quick else (32, 65)
    if args.quick:  # the tests' size: one layer has the graph break (and the opaque op's one graph) at a third of
        cfg = dataclasses.replace(cfg, num_hidden_layers=1)  # the compile time
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[:, :3] = False  # left padding, as the cipher task's prompts have

    def grad(model):
        model.zero_grad(set_to_none=True)
        logits, _ = model(ids, valid_BT=valid)
        logits.float().log_softmax(-1)[valid].mean().backward()
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    model = build_model(cfg)
    ref, rows, arms = grad(model), [dict(arm="eager", first_call_s=None, graphs=None, grad_max_abs_diff=0.0)], {}
    for name, ctx in (("compiled", contextlib.nullcontext), ("compiled, opaque grouped_mm", opaque_experts)):
        # an empty inductor cache, so the first call's time is a cold compile's, as a fresh machine's first run
        with ctx(), tempfile.TemporaryDirectory() as cache, _env(TORCHINDUCTOR_CACHE_DIR=cache):
            torch._dynamo.reset()
            graphs = torch._dynamo.explain(model)(ids, valid_BT=valid).graph_count
            torch._dynamo.reset()
            fn = torch.compile(model)
            t0 = time.perf_counter()
            got = grad(fn)  # the first call compiles
            rows.append(dict(arm=name, first_call_s=time.perf_counter() - t0, graphs=graphs,
                             grad_max_abs_diff=float((got - ref).abs().max())))

        def compiled(fn=fn, ctx=ctx):
            with ctx():  # the patch only around its own calls: eager is the code as it stands
                return grad(fn)

        arms[name] = compiled
    # all three timed in one interleaved run. The second arm's reset dropped the first arm's graphs (it clears
    # dynamo's caches, so that each arm's first call is a cold compile), and the first arm recompiles in the untimed
    # warm-up round; then both arms' graphs live side by side (dynamo's guards on r3.model.moe's functions tell them
    # apart) and no call recompiles (seen with torch._dynamo's graph counter at CI size)
    t = interleaved(clock, {"eager": lambda: grad(model), **arms}, args.reps)
    for r in rows:
        r.update(ms=t[r["arm"]] * 1e3, speedup=t["eager"] / t[r["arm"]], batch=B, seq=T,
                 **(dict(layers=1) if args.quick else {}),
                 grad_max_abs=float(ref.abs().max()))
    return rows
