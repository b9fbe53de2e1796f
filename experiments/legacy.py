"""The rollout engine's decode kernels before docs/speed.md's two speed changes, put back inside today's code for a
comparison: the speed study's decode section times them (experiments/speed/bench.py), the mismatch study measures
what the change did to the mismatch (experiments/mismatch/numerics.py).

  decode attention  SDPA's CPU kernel for every decode step (today: `r3.model.model.decode_attention` for
                    low-precision engines)
  fp32 MoE decode   the grouped GEMMs (today: every expert on every token for small batches,
                    `r3.model.moe.ALL_EXPERTS_MAX_MACS`, as bf16 did before)
"""
import contextlib

import torch
import torch.nn.functional as F

import r3.model.model
import r3.model.moe


@contextlib.contextmanager
def legacy():
    """The engine's kernels before the change: SDPA for every decode step, all experts only in bf16."""
    def sdpa(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask)
    saved = r3.model.model.decode_attention, dict(r3.model.moe.ALL_EXPERTS_MAX_MACS)
    r3.model.model.decode_attention = sdpa
    r3.model.moe.ALL_EXPERTS_MAX_MACS.pop(torch.float32, None)
    try:
        yield
    finally:
        r3.model.model.decode_attention = saved[0]
        r3.model.moe.ALL_EXPERTS_MAX_MACS.clear()
        r3.model.moe.ALL_EXPERTS_MAX_MACS.update(saved[1])
