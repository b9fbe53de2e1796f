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
            experiments.legacy `legacy()` (SDPA decode attention, grouped fp32 experts) against today's, by
            engine dtype, rows and cached positions: what the engine's decode kernels bought
  compile   the trainer's toy forward + backward at a headline mini-step's shape (32 rows of 65 positions): eager,
            `torch.compile` as the code stands (fp32 grouped_mm cannot be traced, so the expert path breaks the
            graph), and compiled with fp32 grouped_mm and its backward as opaque custom ops (a probe: the code does
            not use them); compile seconds, graphs per forward and the gradient's distance from eager's
  step      the headline RL step (experiments.sweep HEADLINE flags, all their logging) at an older commit
            (--step-base) and at this checkout, alternated: marginal wall seconds per step on one thread (a
            --step-long run minus a --step-short one, so start-up cancels), where the time went (each train.py
            phase, experiments/speed/step_timer.py), and whether the two trajectories are bit-identical
Weights: our model is built, written with `r3.scale.hf.save_pretrained` and read by transformers' `from_pretrained`;
the JSON records the fp32 logit max-abs difference of the two on the same tokens (the parity check).

    python -m experiments.speed [--quick] [--sections moe train generate scaling] [--out results/speed.json]
    python -m experiments.speed --sections step --out results/speed_step.json   # ~1 h on 2 shared cores
    python -m experiments.speed --sections decode --out results/speed_decode.json   # ~1 min
    python -m experiments.speed --sections compile --reps 21 --out results/speed_compile.json   # ~1 min
    python -m experiments.speed --device cuda --sections moe --moe-tokens 8192 --moe-hidden 2048 \\
        --moe-inter 768 --moe-experts 128 --moe-dtypes bf16      # Qwen3-30B-A3B layer shapes on a GPU
"""
import argparse
import os
import sys
import tempfile
import time

import torch
from transformers.utils import logging as hf_logging

from experiments.common import fmt, markdown_table, write_results
from experiments.speed.bench import (CONFIGS, DTYPES, Clock, bench_compile, bench_decode, bench_generate, bench_moe,
                                     bench_train)
from experiments.speed.step import STEP_ARMS, bench_step
from r3.errors import run_main


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
        out.append(f"\n**torch.compile probe, the trainer's forward + backward** ({'a 1-layer ' if c.get('layers') == 1 else ''}toy, fp32, {c['batch']} rows of "
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
