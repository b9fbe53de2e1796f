"""Remote rollout engines: SGLang or vLLM servers over HTTP, giving the same `Batch` as the in-process
`r3.rollout.engine.Engine` (token ids out; token ids, the engine's log-probs and routes back), with weight sync through
a folder that the trainer and every server read.

    engine = make_engine("sglang:http://10.0.0.5:30000,http://10.0.0.6:30000", model.cfg, weights_dir="/shared/r3")
    engine.sync(model)       # every rank calls it (the FSDP gather is collective); rank 0 writes, every server loads
    batch = engine.generate(prompts, max_new_tokens=..., eos_ids=..., pad_id=..., group_size=G, temperature=...)

The client, split by concern:
  r3/rollout/remote_http.py     one server over HTTP: JSON exchanges, the start-up wait, bounded retries, time-outs
  r3/rollout/remote_engine.py   what both engines share: several servers, chunked requests, seeds, weight sync, checks
  r3/rollout/remote_sglang.py   SGLang's /generate, /update_weights_from_disk, /abort_request, /get_server_info
  r3/rollout/remote_vllm.py     vLLM's /v1/completions and the dev-mode reload (VLLM_SERVER_DEV_MODE=1)
How to launch the servers, and the flags each needs: docs/servers.md. No batch is returned without engine
log-probs, nor without routes when the engine requires them (R3: `require_routes`, the default), so no R3 step trains
without replay. After every weight sync each server's weights are checked (r3/rollout/sync_check.py).
Left out: streaming, text prompts, multi-turn `routed_experts_start_len`, NCCL weight sync
(update_weights_from_distributed / tensor).
"""
from r3.rollout.remote_engine import RemoteEngine
from r3.rollout.remote_http import RemoteEngineError
from r3.rollout.remote_sglang import SGLangEngine
from r3.rollout.remote_vllm import VLLMEngine

ENGINES = {"sglang": SGLangEngine, "vllm": VLLMEngine}
__all__ = ["ENGINES", "RemoteEngine", "RemoteEngineError", "SGLangEngine", "VLLMEngine", "make_engine",
           "parse_engine"]


def parse_engine(spec: str) -> tuple[str, list[str]]:
    """'sglang:URL1,URL2' or 'vllm:URL' -> (kind, [URL, ...]); ValueError naming the expected form."""
    kind, sep, rest = spec.partition(":")
    urls = [u.strip() for u in rest.split(",")]
    if not sep or kind not in ENGINES or not all(u.startswith(("http://", "https://")) for u in urls):
        raise ValueError(f"engine {spec!r}: expected sglang:http://HOST:PORT or vllm:http://HOST:PORT (several "
                         f"servers: sglang:http://HOST1:PORT,http://HOST2:PORT)")
    if len(set(urls)) != len(urls):
        raise ValueError(f"engine {spec!r}: a server is listed twice")
    return kind, urls


def make_engine(spec: str, cfg, *, wait_ready: bool = True, **kw) -> RemoteEngine:
    """An engine for a model with config `cfg` from 'KIND:URL[,URL...]'; waits for every server by default.
    Keywords go to the engine: weights_dir, weights_dtype, timeout, wait, retries, groups_per_request, inflight,
    sync_check, require_routes (vLLM: model_name, reload_method)."""
    kind, urls = parse_engine(spec)
    engine = ENGINES[kind](urls, cfg, **kw)
    if wait_ready:
        engine.wait_ready()
    return engine
