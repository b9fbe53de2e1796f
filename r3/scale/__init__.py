"""scale/: real checkpoints on many devices. May import r3.errors, model/ and runs/.

  hf.py      HF Qwen3-MoE checkpoints in and out as a key map, strict; the checkpoint's tokenizer
  fsdp.py    FSDP2 in one function, and the rank-aware helpers (global means, gathered state dicts)
  memory.py  the `--dry-run` memory plan
"""
