"""rollout/: sampling with recorded routes. May import r3.errors, model/, runs/, scale/ and tasks/.

  engine.py          the rollout engine: its own weights at rollout precision, KV-cache sampling, recorded routes
  batch.py           the `Batch`, in memory and on disk (checksummed), and its loaders
  engine_formats.py  SGLang / vLLM payloads: samples with routes from a server
  remote.py          picks a remote engine by `--engine`; one client module per server below it
  remote_engine.py   what every remote client shares: batches from samples, weight sync through HF checkpoints
  remote_http.py     HTTP to one server (standard library): JSON exchanges, the start-up wait, bounded retries
  remote_sglang.py   the SGLang client;  remote_vllm.py  the vLLM client
  sync_check.py      the post-sync weight check: a fixed probe scored by each server against the trainer's reference
  vllm_cpu_reload.py runs inside vLLM's worker, not here: the reload that re-packs CPU MoE weights (vLLM 0.32's bug)
"""
