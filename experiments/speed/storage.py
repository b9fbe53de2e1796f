"""Route storage: bytes and encode/decode throughput of every codec in r3/model/routing.py, beside production formats.

Geometries: Qwen3-30B-A3B (128 experts, top-8, 48 layers), a 256-expert top-8 router (DeepSeek-V3-like; 48 layers
here so its sample compares with Qwen's), and our toy (8 experts, top-2, 4 layers). The sample column is a 32K-token
sequence times the geometry's layers and top-k. Anchors: SGLang / slime / vLLM int32 ids, verl uint8 ids, the seed
paper's bit-packed mask. Throughput: random routes (distinct ids in random order), one CPU thread, every codec
timed side by side within each repetition, median over repetitions, in M token-layers per second of CPU time.

    python -m experiments.speed.storage [--rows 65536] [--reps 5] [--out results/storage.json]
"""
import argparse
import time

import torch

from experiments.common import write_results
from r3.errors import run_main
from r3.model.routing import CODECS, SET_CODECS, decode_routes, encode_routes, encoded_nbytes, row_bits

GEOMETRIES = {"Qwen3-30B-A3B": (128, 8, 48), "256e-top8": (256, 8, 48), "toy": (8, 2, 4)}
ANCHORS = {"int32": "SGLang / slime / vLLM wire", "uint8": "verl (R2)", "bitmask": "seed paper (R3)",
           "bool_mask": "", "packed": "", "rank": "information limit"}
SAMPLE_TOKENS = 32 * 1024
# CPU time of this process, torch on one thread: robust to other jobs sharing the machine's cores (wall time
# on a loaded 2-core box swung +-15% between identical arms).
CLOCK = time.process_time


def random_routes(n: int, E: int, K: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = [torch.rand(c, E, generator=g).topk(K, -1).indices for c in [4096] * (n // 4096) + [n % 4096] if c]
    return torch.cat(out)


def bench(E: int, K: int, n: int, reps: int) -> dict:
    ids = random_routes(n, E, K)
    times = {c: ([], []) for c in CODECS}
    for _ in range(reps):
        for c in CODECS:
            t0 = CLOCK()
            data = encode_routes(ids, c, E)
            t1 = CLOCK()
            out = decode_routes(data, c, ids.shape, E)
            t2 = CLOCK()
            times[c][0].append(t1 - t0)
            times[c][1].append(t2 - t1)
            want = ids.sort(-1).values if c in SET_CODECS else ids
            assert torch.equal(out.long(), want), c
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {c: (n / med(e) / 1e6, n / med(d) / 1e6) for c, (e, d) in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=65536, help="token-layer rows timed per codec and repetition")
    ap.add_argument("--reps", type=int, default=5, help="repetitions; the table reports medians")
    ap.add_argument("--out", default="results/storage.json", help="JSON output path")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, (E, K, L) in GEOMETRIES.items():
        speed = bench(E, K, args.rows, args.reps)
        int32_bytes = encoded_nbytes("int32", SAMPLE_TOKENS * L, E, K)
        for c in CODECS:
            nbytes = encoded_nbytes(c, SAMPLE_TOKENS * L, E, K)
            rows.append(dict(geometry=name, num_experts=E, top_k=K, layers=L, codec=c, anchor=ANCHORS[c],
                             keeps_order=c not in SET_CODECS, bits_per_token_layer=row_bits(c, E, K),
                             bytes_per_token_layer=row_bits(c, E, K) / 8, sample_tokens=SAMPLE_TOKENS,
                             sample_bytes=nbytes, vs_int32=nbytes / int32_bytes,
                             encode_mrows_s=speed[c][0], decode_mrows_s=speed[c][1]))
    print(f"Route storage: sample = {SAMPLE_TOKENS} tokens x layers x top-k; throughput = median of {args.reps} "
          f"reps on {args.rows} random token-layers, 1 thread, CPU time, M token-layers/s\n")
    print("| geometry (E/k/L) | codec | used by | order | bytes / token-layer | sample MiB | vs int32 "
          "| encode M/s | decode M/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        geo = f"{r['geometry']} ({r['num_experts']}/{r['top_k']}/{r['layers']})"
        print(f"| {geo} | {r['codec']} | {r['anchor']} | {'kept' if r['keeps_order'] else 'set'} "
              f"| {r['bytes_per_token_layer']:g} | {r['sample_bytes'] / 2 ** 20:.2f} | {r['vs_int32']:.3f} "
              f"| {r['encode_mrows_s']:.2f} | {r['decode_mrows_s']:.2f} |")
    write_results(args.out, dict(rows=rows, timed_rows=args.rows, reps=args.reps, threads=1, clock="process_time"))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    run_main(main)
