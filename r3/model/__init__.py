"""model/: the network, and what its forward records or replays. The bottom wing: imports r3.errors only.

  model.py    the Transformer, its config (ModelConfig) and presets, the KV cache; every forward returns its routes
  moe.py      the MoE block: router, gates, record and replay (`MoE.route`), grouped-GEMM experts, the slow reference
  routing.py  route containers and codecs (routes on disk and on the wire)
  quant.py    simulated serving numerics: the engine's weight formats (bf16, fp8, int4, ...) and the router grid
  prefix.py   the shared-prefix forward: one prompt pass per GRPO group
"""
