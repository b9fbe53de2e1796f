"""Speed: ours vs transformers' `Qwen3MoeForCausalLM` (its default grouped_mm experts) on identical weights.

Four measurements, each arm interleaved with the others within every repetition (machine load hits all alike),
medians over repetitions; on CPU the clock is this process's CPU time with torch on one thread (robust to other
jobs on the machine), on CUDA wall time after a synchronize. Ratios are ours / transformers: below 1 is faster for
times, above 1 is faster for tokens/s.
  moe       one MoE block forward + backward at E = 8, 32, 128 experts (top-8, fixed tokens): ours with the
            router's top-k, ours replaying recorded routes, transformers' `Qwen3MoeSparseMoeBlock`
  train     a full train step (forward, token cross-entropy, backward), ours with and without replay vs transformers
  generate  new tokens/s: our `Engine.generate` (KV cache, recording routes) vs transformers `generate()` (sampling,
            no early stop), bf16 and fp32
  scaling   train step time vs sequence length and batch, ours vs transformers
  decode    one decode forward of the rollout engine (toy, chain:1024's positions), the kernels of
            experiments.numerics `legacy()` (SDPA decode attention, grouped fp32 experts) against today's, by
            engine dtype, rows and cached positions: what the engine's decode kernels bought
  compile   the trainer's toy forward + backward at a headline mini-step's shape (32 rows of 65 positions): eager,
            `torch.compile` as the code stands (fp32 grouped_mm cannot be traced, so the expert path breaks the
            graph), and compiled with fp32 grouped_mm and its backward as opaque custom ops (a probe: the code does
            not use them); compile seconds, graphs per forward and the gradient's distance from eager's
  step      the headline RL step (experiments.sweep HEADLINE flags, all their logging) at an older commit
            (--step-base) and at this checkout, alternated: marginal wall seconds per step on one thread (a
            --step-long run minus a --step-short one, so start-up cancels), where the time went (each train.py
            phase, experiments/step_timer.py), and whether the two trajectories are bit-identical
Weights: our model is built, written with `r3.hf.save_pretrained` and read by transformers' `from_pretrained`;
the JSON records the fp32 logit max-abs difference of the two on the same tokens (the parity check).

    python -m experiments.speed [--quick] [--sections moe train generate scaling] [--out results/speed.json]
    python -m experiments.speed --sections step --out results/speed_step.json   # ~1 h on 2 shared cores
    python -m experiments.speed --sections decode --out results/speed_decode.json   # ~1 min
    python -m experiments.speed --sections compile --reps 21 --out results/speed_compile.json   # ~1 min
    python -m experiments.speed --device cuda --sections moe --moe-tokens 8192 --moe-hidden 2048 \\
        --moe-inter 768 --moe-experts 128 --moe-dtypes bf16      # Qwen3-30B-A3B layer shapes on a GPU
"""
import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # the reference: pip install -e .[test]
from transformers.utils import logging as hf_logging
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from experiments.common import fmt, markdown_table, write_results
from experiments.mismatch.numerics import legacy
from r3.rollout.engine import Engine
from r3.errors import run_main
from r3.scale.hf import save_pretrained
from r3.model.model import PRESETS, KVCache, ModelConfig, build_model
import r3.model.moe
from r3.model.moe import MoE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # experiments/speed/ -> root
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


STEP_ARMS = {"none": ("none", "fp8-router"), "r3": ("r3", "fp8-router"), "oracle": ("none", "fp32")}
STEP_KEYS = ("reward", "loss", "grad_norm", "eval/accuracy")  # what "the same trajectory" compares, step by step


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
    """r3.moe's expert path with fp32 grouped_mm as the opaque ops above, also while compiling."""
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
    # warm-up round; then both arms' graphs live side by side (dynamo's guards on r3.moe's functions tell them
    # apart) and no call recompiles (seen with torch._dynamo's graph counter at CI size)
    t = interleaved(clock, {"eager": lambda: grad(model), **arms}, args.reps)
    for r in rows:
        r.update(ms=t[r["arm"]] * 1e3, speedup=t["eager"] / t[r["arm"]], batch=B, seq=T,
                 grad_max_abs=float(ref.abs().max()))
    return rows


def checkout(commit: str, tmp: str) -> str:
    """`commit`'s tracked files unpacked into tmp/COMMIT (git archive): an old version to time beside this one."""
    path = os.path.join(tmp, commit)
    os.makedirs(path)
    archive = subprocess.run(["git", "-C", ROOT, "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", path], input=archive, check=True)
    return path


def headline_flags(tree: str) -> list[str]:
    """The tree's own HEADLINE (each commit is timed with the flags its sweeps ran): experiments.sweep's, or
    experiments.collapse's in a commit made before the study folders."""
    code = ("try:\n    from experiments.sweep import HEADLINE\nexcept ImportError:\n"
            "    from experiments.collapse import HEADLINE\nprint(HEADLINE)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": tree})
    return out.stdout.split()


def timed_run(tree: str, flags: list[str], steps: int, tmp: str, tag: str) -> dict:
    """One train.py run under experiments/step_timer.py; returns its timings and its metrics rows."""
    out, js = os.path.join(tmp, "runs", tag), os.path.join(tmp, tag + ".json")
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "speed", "step_timer.py"), tree, js, *flags, "--steps",
           str(steps), "--out", out, "--overwrite", "--quiet", "--no-plot", "--threads", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tree,
                                                                  "OMP_NUM_THREADS": "1"})
    if r.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{r.stderr[-3000:]}")
    with open(js) as f, open(os.path.join(out, "metrics.jsonl")) as m:
        return dict(json.load(f), rows=[json.loads(line) for line in m])


def same_trajectory(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in STEP_KEYS)


def bench_step(args, tmp: str) -> list[dict]:
    """Marginal seconds per step, base commit vs this checkout, each arm, the trees alternated every repetition."""
    trees = {"base": checkout(args.step_base, tmp), "head": ROOT}
    flags = {name: headline_flags(tree) for name, tree in trees.items()}
    S, L = args.step_short, args.step_long
    for name, tree in trees.items():  # untimed: builds each tree's warm-up cache
        timed_run(tree, flags[name] + ["--seed", "0"], 1, tmp, f"prime-{name}")
    res = {(t, a): [] for t in trees for a in args.step_arms}
    combos = [(rep, a) for rep in range(args.step_reps) for a in args.step_arms]
    for rep, arm in tqdm(combos, desc="step", leave=False):
        replay, dtype = STEP_ARMS[arm]
        for name in (list(trees) if rep % 2 == 0 else list(trees)[::-1]):
            f = flags[name] + ["--replay", replay, "--rollout-dtype", dtype, "--seed", "0"]
            short, long = (timed_run(trees[name], f, n, tmp, f"{name}-{arm}-{n}-{rep}") for n in (S, L))
            phases = {k: (long["phases"][k] - short["phases"].get(k, 0.0)) / (L - S) for k in long["phases"]}
            res[name, arm].append(dict(step_s=(long["wall_s"] - short["wall_s"]) / (L - S), phases=phases,
                                       cpu_step_s=(long["cpu_s"] - short["cpu_s"]) / (L - S), rows=long["rows"],
                                       faults_step=(long.get("minor_faults", 0) - short.get("minor_faults", 0)) /
                                       (L - S)))
    rows = []
    for arm in args.step_arms:
        b, h = res["base", arm], res["head", arm]
        med = lambda runs: statistics.median(r["step_s"] for r in runs)  # noqa: E731
        phase = lambda runs: {k: statistics.median(r["phases"].get(k, 0.0) for r in runs)  # noqa: E731
                              for k in sorted({k for r in runs for k in r["phases"]})}
        cpu = lambda runs: statistics.median(r["cpu_step_s"] for r in runs)  # noqa: E731
        rows.append(dict(arm=arm, base=args.step_base, base_step_s=med(b), head_step_s=med(h),
                         speedup=med(b) / med(h), base_cpu_step_s=cpu(b), head_cpu_step_s=cpu(h),
                         cpu_speedup=cpu(b) / cpu(h), base_phases_s=phase(b), head_phases_s=phase(h),
                         base_faults_step=statistics.median(r["faults_step"] for r in b),
                         head_faults_step=statistics.median(r["faults_step"] for r in h),
                         base_runs_s=[r["step_s"] for r in b], head_runs_s=[r["step_s"] for r in h],
                         same_trajectory=same_trajectory(b[0]["rows"], h[0]["rows"]),
                         base_flags=" ".join(flags["base"]), head_flags=" ".join(flags["head"])))
    return rows


def tables(res: dict) -> str:
    out = []
    if res.get("moe"):
        out.append("**MoE block, forward + backward** (time ours / transformers; below 1 is faster)\n")
        out.append(markdown_table(
            ["dtype", "experts", "top-k", "hidden", "expert width", "tokens", "ours ms", "ours replay ms",
             "transformers ms", "ours / tf", "replay / tf"],
            [[r["dtype"], str(r["experts"]), str(r["top_k"]), str(r["hidden"]), str(r["inter"]), str(r["tokens"]),
              fmt(r["ours_ms"]), fmt(r["replay_ms"]), fmt(r["hf_ms"]), f"{r['ratio']:.2f}",
              f"{r['replay_ratio']:.2f}"] for r in res["moe"]]))
    for key, title in (("train", "Train step, forward + backward, fp32"),
                       ("scaling", "Train step vs sequence length and batch, fp32")):
        if res.get(key):
            out.append(f"\n**{title}** (time ours / transformers)\n")
            out.append(markdown_table(
                ["config", "batch", "seq", "ours ms", "ours replay ms", "transformers ms", "ours / tf",
                 "replay / tf", "ours µs / token"],
                [[r["config"], str(r["batch"]), str(r["seq"]), fmt(r["ours_ms"]), fmt(r["replay_ms"]),
                  fmt(r["hf_ms"]), f"{r['ratio']:.2f}", f"{r['replay_ratio']:.2f}",
                  fmt(r["ours_ms"] * 1e3 / (r["batch"] * r["seq"]))] for r in res[key]]))
    if res.get("generate"):
        out.append("\n**Generation, new tokens/s** (ours records routes; tokens/s ours / transformers: above 1 is "
                   "faster)\n")
        out.append(markdown_table(
            ["config", "batch", "dtype", "prompt", "new tokens", "ours tok/s", "transformers tok/s", "ours / tf"],
            [[r["config"], str(r["batch"]), r["dtype"], str(r["prompt_len"]), str(r["new_tokens"]),
              fmt(r["ours_tok_s"]), fmt(r["hf_tok_s"]), f"{r['speedup']:.2f}"] for r in res["generate"]]))
    if res.get("decode"):
        out.append("\n**Engine decode forward, old kernels vs new** (ms per forward; above 1 is faster)\n")
        out.append(markdown_table(["engine", "rows", "cached positions", "old ms", "new ms", "speed-up"],
                                  [[r["dtype"], str(r["rows"]), str(r["cached"]), fmt(r["old_ms"]), fmt(r["new_ms"]),
                                    f"{r['speedup']:.2f}x"] for r in res["decode"]]))
    if res.get("compile"):
        c = res["compile"][0]
        out.append(f"\n**torch.compile probe, the trainer's forward + backward** (toy, fp32, {c['batch']} rows of "
                   f"{c['seq']} positions; ms per call, the three arms alternated; above 1 is faster)\n")
        out.append(markdown_table(
            ["arm", "ms", "speed-up", "first call s (compiles)", "graphs per forward", "grad max abs diff vs eager",
             "grad max abs"],
            [[r["arm"], fmt(r["ms"]), f"{r['speedup']:.2f}x", fmt(r["first_call_s"]),
              "—" if r["graphs"] is None else str(r["graphs"]), fmt(r["grad_max_abs_diff"]), fmt(r["grad_max_abs"])]
             for r in res["compile"]]))
    if res.get("step"):
        st = res["step"]
        out.append(f"\n**Headline RL step, marginal wall time per step** (steps {res['config']['step_short']} to "
                   f"{res['config']['step_long']}, one thread; {st[0]['base']} vs this checkout, alternated; "
                   f"medians of {res['config']['step_reps']}; above 1 is faster)\n")
        out.append(markdown_table(
            ["arm", f"{st[0]['base'][:8]} s/step", "HEAD s/step", "speed-up (wall)", "CPU s/step (base, HEAD)",
             "speed-up (CPU)", "page faults / step (base, HEAD)", "wall s/step of each run (base / HEAD)",
             "same trajectory"],
            [[r["arm"], f"{r['base_step_s']:.3f}", f"{r['head_step_s']:.3f}", f"{r['speedup']:.2f}x",
              f"{r['base_cpu_step_s']:.3f}, {r['head_cpu_step_s']:.3f}", f"{r['cpu_speedup']:.2f}x",
              f"{r.get('base_faults_step', 0):.0f}, {r.get('head_faults_step', 0):.0f}",
              " ".join(f"{x:.3f}" for x in r["base_runs_s"]) + " / " + " ".join(f"{x:.3f}" for x in r["head_runs_s"]),
              "yes" if r["same_trajectory"] else "no"] for r in st]))
        names = sorted({k for r in st for k in (*r["base_phases_s"], *r["head_phases_s"])})
        out.append("\nWhere the time went, seconds per step by train.py phase (phases nest: `update` holds the "
                   "mini-steps, `log_guard_checkpoint` the held-out evaluation, val/kl and checkpoints)\n")
        out.append(markdown_table(
            ["phase"] + [f"{r['arm']} {w}" for r in st for w in ("base", "HEAD")],
            [[n] + [fmt(r[f"{w}_phases_s"].get(n)) for r in st for w in ("base", "head")] for n in names]))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 1 rep (CI smoke test), seconds")
    ap.add_argument("--sections", nargs="+", default=["moe", "train", "generate", "scaling"],
                    choices=["moe", "train", "generate", "scaling", "step", "decode", "compile"],
                    help="which measurements to run (step, the headline RL step against an older commit, is not in "
                    "the default set: ~1 h)")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                    help="model configs for train and generate")
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES),
                    help="generation dtypes (the train step is fp32, as the trainer)")
    ap.add_argument("--moe-dtypes", nargs="+", default=["fp32"], choices=list(DTYPES), help="MoE block dtypes")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions per measurement (medians)")
    ap.add_argument("--moe-experts", type=int, nargs="+", default=[8, 32, 128], help="E for the MoE block")
    ap.add_argument("--moe-top-k", type=int, default=8, help="K for the MoE block")
    ap.add_argument("--moe-hidden", type=int, default=512, help="hidden size of the MoE block")
    ap.add_argument("--moe-inter", type=int, default=192, help="expert width of the MoE block")
    ap.add_argument("--moe-tokens", type=int, nargs="+", default=[512, 4096], help="tokens through the MoE block")
    ap.add_argument("--train-batch", type=int, default=16, help="train step batch")
    ap.add_argument("--train-seq", type=int, default=64, help="train step sequence length")
    ap.add_argument("--gen-batch", type=int, nargs="+", default=[8, 64], help="generation batch sizes")
    ap.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per row")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens sampled per row")
    ap.add_argument("--scaling-config", default="qwen3-ratio", choices=list(CONFIGS), help="config for scaling")
    ap.add_argument("--scaling-seqs", type=int, nargs="+", default=[32, 64, 128, 256], help="seq lengths (batch 8)")
    ap.add_argument("--scaling-batches", type=int, nargs="+", default=[4, 16, 64], help="batches (seq 64)")
    ap.add_argument("--step-base", default="f327f3e", help="step: the commit to time against (a git revision)")
    ap.add_argument("--step-arms", nargs="+", default=list(STEP_ARMS), choices=list(STEP_ARMS),
                    help="step: headline arms (none/r3: fp8-router engine; oracle: fp32 engine, no replay)")
    ap.add_argument("--step-short", type=int, default=25, help="step: steps of the short run")
    ap.add_argument("--step-long", type=int, default=125, help="step: steps of the long run (the long - short "
                    "window holds the headline's fidelity and evaluation steps in their 1000-step proportion)")
    ap.add_argument("--step-reps", type=int, default=2, help="step: repetitions (trees alternated each one)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (CPU time is per process)")
    ap.add_argument("--out", default="results/speed.json", help="JSON path; the markdown table goes beside it")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.configs, args.moe_experts, args.moe_tokens = 1, ["toy"], [8, 32], [64]
        args.moe_dtypes = ["fp32", "bf16"]
        args.moe_hidden, args.moe_inter, args.moe_top_k = 64, 32, 2
        args.train_batch, args.train_seq, args.gen_batch, args.new_tokens, args.prompt_len = 2, 8, [2], 3, 4
        args.scaling_config, args.scaling_seqs, args.scaling_batches = "toy", [8], [2]
        args.step_short, args.step_long, args.step_reps, args.step_arms = 2, 4, 1, ["none"]
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    clock, dev = Clock(args.device), torch.device(args.device)
    t0 = time.perf_counter()
    res = dict(config=vars(args), torch=torch.__version__, clock="wall" if clock.cuda else "process_time",
               device=torch.cuda.get_device_name() if clock.cuda else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        if "moe" in args.sections:
            res["moe"] = bench_moe(args, clock, dev)
        if "train" in args.sections:
            res["train"] = bench_train(args, clock, dev, tmp,
                                       [(c, args.train_batch, args.train_seq) for c in args.configs])
        if "generate" in args.sections:
            res["generate"] = bench_generate(args, clock, dev, tmp)
        if "step" in args.sections:
            res["step"] = bench_step(args, tmp)
        if "decode" in args.sections:
            res["decode"] = bench_decode(args, clock)
        if "compile" in args.sections:
            res["compile"] = bench_compile(args, clock)
        if "scaling" in args.sections:
            c = args.scaling_config
            shapes = [(c, 8, T) for T in args.scaling_seqs] + [(c, B, 64 if not args.quick else 8)
                                                              for B in args.scaling_batches]
            res["scaling"] = bench_train(args, clock, dev, tmp, shapes)
    res["wall_s"] = time.perf_counter() - t0
    md = tables(res)
    print(md)
    print(f"wall time {res['wall_s']:.0f} s")
    md_path = os.path.splitext(args.out)[0] + ".md"
    write_results(args.out, res, md=f"`{' '.join(['python -m experiments.speed'] + sys.argv[1:])}`: {res['device']}, "
                                    f"torch {torch.__version__}, {res['clock']}, {args.threads} thread(s), medians of "
                                    f"{args.reps} interleaved reps, wall time {res['wall_s']:.0f} s\n\n" + md)
    print(f"wrote {args.out} and {md_path}")


if __name__ == "__main__":
    run_main(main)
