"""The post-sync weight check: after a weight sync, every server scores a small fixed probe and the trainer compares
with its own log-probs of the weights it wrote. A server that answers the load with 200 but serves other weights is
caught here instead of sampling off-policy silently (vLLM 0.32 on CPU does exactly that: it does not re-pack the MoE
expert weights on a reload; docs/servers.md, "The CPU reload bug").

  probe      PROBE_SEQS sequences of PROBE_LEN token ids drawn once from a fixed seed over the vocabulary. A server
             scores each as a prompt (vLLM `prompt_logprobs: 0`, SGLang `logprob_start_len: 0`): log p(x_j | x_<j)
             for j >= 1; position 0 has none (vLLM and SGLang both send null there).
  reference  the trainer's forward in fp32 over the weights as the server holds them: the synced weights rounded to
             the server's precision (its reported dtype, else the dtype the weights were written in), then fp32.
  noise      the trainer's own forward at that precision (weights and arithmetic), against the reference: how far an
             engine of this precision lands from it on this model. 0 in fp32; in bf16 it grows with how sharp the
             model is (a router near a tie flips), from 1e-3 for a small random init to 0.4 for a random std-0.3 one.
  gap        the mean |server - reference| over the probe's scored positions (the max is reported beside it).
             A server passes when gap <= FLOOR + SCALE x noise of its precision (TOLERANCE).
Tolerances (FLOOR, SCALE), measured on this project's CPU (results/servers/sync_check.md on the stand-in over 23
toy models; results/servers/vllm_cpu.md on vLLM 0.32 over the served toy and random inits):
  fp32  (1e-5, 0): healthy engines land at 1e-7 to 5e-7 mean (vLLM: max 1.9e-6 on the served toy), up to 5e-6 on
        chaotic random inits (std 0.3); misread experts shift the mean by 5e-3 (a flat random init) to 4.
  bf16  (1e-3, 4): a healthy vLLM's gap over the predicted noise was 0.28 to 2.46 (the stand-in's is 1: it computes
        as the trainer's bf16 forward does); misread experts give 10.7x to 64.5x on vLLM, 4.1x to 140x on the
        stand-in (the two flat qwen3-ratio inits, at 4.1x and 4.2x, pass: a 5e-3 shift).
  fp16  bf16's (fp16 rounds less).
Other precisions (the stand-in's simulated fp8, int4, ...) have no tolerance: the check refuses to judge them unless
it only warns (`mode="warn"`). It is never off.
Left out: a reference on the GPUs under FSDP (rank 0 builds it on its CPU from the gathered state dict: at 30B a
second full copy, and a third at the engine's precision), sampled tokens (the probe scores prompts only), routes.
"""
import math

import torch

from r3.model.model import Transformer
from r3.scale.fsdp import meta_model

PROBE_SEQS, PROBE_LEN, PROBE_SEED = 4, 16, 20_261_206
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {"fp32": (1e-5, 0.0), "bf16": (1e-3, 4.0), "fp16": (1e-3, 4.0)}  # (FLOOR, SCALE) of the mean gap
_NAMES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "bf16": "bf16", "bfloat16": "bf16",
          "fp16": "fp16", "float16": "fp16", "half": "fp16"}
MODES = ("error", "warn")


def precision(name) -> str | None:
    """'fp32' / 'bf16' / 'fp16' for a dtype or a server's dtype name (SGLang's 'bfloat16', our 'bf16'); None for
    any other (a simulated low-bit format, 'auto' unresolved)."""
    if isinstance(name, torch.dtype):
        return next((k for k, v in PRECISIONS.items() if v == name), None)
    return _NAMES.get(name) if isinstance(name, str) else None


def probe(cfg) -> list[list[int]]:
    """The fixed probe for a model config: PROBE_SEQS x min(PROBE_LEN, max positions) token ids."""
    n = min(PROBE_LEN, cfg.max_position_embeddings)
    g = torch.Generator().manual_seed(PROBE_SEED)
    return torch.randint(0, cfg.vocab_size, (PROBE_SEQS, n), generator=g).tolist()


@torch.no_grad()
def reference(cfg, state_dict: dict, prec: str, seqs: list[list[int]]) -> tuple[torch.Tensor, float]:
    """(log p(x_j | x_<j) for j >= 1, [S, T - 1] float64, of a model holding `state_dict` rounded to precision
    `prec` and computed in fp32; the noise at `prec`: the mean |difference| of the same model computed at `prec`).
    Separate copies: the trainer's own parameters are not touched."""
    dtype, ids = PRECISIONS[prec], torch.tensor(seqs, dtype=torch.long)

    def scores(compute: torch.dtype) -> torch.Tensor:
        model: Transformer = meta_model(cfg)
        model.load_state_dict({k: v.detach().to("cpu", dtype).to(compute) for k, v in state_dict.items()},
                              strict=True, assign=True)
        logits, _ = model.eval()(ids)
        return logits.float().log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].double()
    ref = scores(torch.float32)
    return ref, 0.0 if dtype == torch.float32 else float((scores(dtype) - ref).abs().mean())


def read_scores(values, seqs: list[list[int]], where: str) -> torch.Tensor:
    """A server's probe log-probs, one list per sequence of T - 1 finite numbers <= 0 (entry 0 already dropped) ->
    [S, T - 1] float64; ValueError naming the sequence and position otherwise."""
    if not isinstance(values, list) or len(values) != len(seqs):
        raise ValueError(f"{where}: expected log-probs for {len(seqs)} probe sequences, got "
                         f"{len(values) if isinstance(values, list) else type(values).__name__}")
    for i, (v, s) in enumerate(zip(values, seqs)):
        if not isinstance(v, list) or len(v) != len(s) - 1:
            raise ValueError(f"{where}: probe sequence {i}: {len(v) if isinstance(v, list) else v!r} log-probs for "
                             f"positions 1..{len(s) - 1}")
        bad = [j for j, x in enumerate(v) if isinstance(x, bool) or not isinstance(x, (int, float))
               or not math.isfinite(x) or x > 1e-4]
        if bad:
            raise ValueError(f"{where}: probe sequence {i} position {bad[0] + 1}: {v[bad[0]]!r} is not a log-prob")
    return torch.tensor(values, dtype=torch.float64)


def verdict(url: str, prec: str | None, got: torch.Tensor, ref: torch.Tensor, noise: float) -> dict:
    """One server's result: {server, precision, gap (mean), max_gap, noise, tolerance, ok, tokens}; tolerance and
    ok None when no tolerance is known for `prec`."""
    d = (got - ref).abs()
    gap, tol = float(d.mean()), None
    if prec in TOLERANCE:
        floor, scale = TOLERANCE[prec]
        tol = floor + scale * noise
    return dict(server=url, precision=prec, gap=gap, max_gap=float(d.max()), noise=noise, tolerance=tol,
                ok=None if tol is None else gap <= tol, tokens=int(d.numel()) + len(got))


def describe(v: dict) -> str:
    head = f"{v['server']}: probe log-probs off by {v['gap']:.2e} on average (max {v['max_gap']:.2e}"
    if v["tolerance"] is None:
        return f"{head}); no tolerance is known for precision {v['precision']!r} (known: {', '.join(TOLERANCE)})"
    return f"{head}; {v['precision']} tolerance {v['tolerance']:.1e}, {v['tokens']} tokens)"
