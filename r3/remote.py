"""Remote rollout engines: SGLang's `/generate` and vLLM's OpenAI `/v1/completions` over HTTP, giving the same
`Batch` as the in-process `r3.engine.Engine` (token ids out, token ids + engine log-probs + routes back), and weight
sync through a folder that trainer and server both read. Standard library HTTP only.

    engine = make_engine("sglang:http://10.0.0.5:30000", model.cfg, weights_dir="/shared/r3-weights")
    engine.sync(model)       # every rank calls it (the FSDP gather is collective); rank 0 writes and tells the server
    batch = engine.generate(prompts, max_new_tokens=..., eos_ids=..., pad_id=..., group_size=G, temperature=...)

SGLang (python/sglang/srt/managers/io_struct.py `GenerateReqInput`, srt/sampling/sampling_params.py):
  request   {"input_ids": [...P*G lists...], "sampling_params": [{"max_new_tokens", "temperature", "top_p",
            "stop_token_ids", "sampling_seed"}, ...], "return_logprob": true, "return_routed_experts": true}: one
            entry per sample (each prompt G times, prompt-major), each with its own `sampling_seed`, so results come
            back in the order sent and a deterministic server reproduces a run (SGLang honours sampling_seed with
            `--sampling-backend pytorch`; the flashinfer sampler refuses it).
  response  a list of {"output_ids", "meta_info": {"output_token_logprobs": [[logprob, id, text], ...],
            "routed_experts": base64, "routed_experts_dtype"?}}, decoded by `r3.engine_formats.sglang_sample`.
  weights   POST /update_weights_from_disk {"model_path", "flush_cache", "weight_version"} -> {"success",
            "message", "num_paused_requests"}, HTTP 400 when it fails (srt/entrypoints/http_server.py).
vLLM (vllm/entrypoints/openai/completion/protocol.py):
  request   POST /v1/completions {"model", "prompt": ids, "n": G, "seed", "max_tokens", "temperature", "top_p",
            "stop_token_ids", "logprobs": 0, "return_token_ids": true}, one request per prompt, sent concurrently
            (children of a seeded request get seed + index: v1/engine/parallel_sampling.py).
  response  choices[i].token_ids / .logprobs.token_logprobs / .routed_experts, plus the response-level
            prompt_routed_experts of split builds; routes as nested lists or base64 of a .npy file (newer builds);
            layouts told apart by `r3.engine_formats.vllm_routes`. Start vLLM with `--logprobs-mode processed_logprobs`,
            else its log-probs ignore the temperature.
  weights   vLLM has no stable reload route. Supported: the dev-mode (VLLM_SERVER_DEV_MODE=1) POST /collective_rpc
            {"method": "reload_weights"} (reloads from the server's own model path: start vLLM on `weights_path`),
            then POST /reset_prefix_cache. Not tested against a real vLLM.

Every failure raises `RemoteEngineError` naming the request (method, URL, what was asked): the server down (after a
bounded wait on refused connections), a timeout, HTTP 4xx/5xx (the server's message quoted), a body that is not
JSON, routes missing / ill-shaped / of an unknown dtype, token or log-prob counts that do not match. No batch is
returned without routes and engine log-probs.
Left out: streaming, text prompts, multi-turn `routed_experts_start_len`, NCCL weight sync
(update_weights_from_distributed / tensor), several servers behind one client (put a router in front).
"""
import ast
import base64
import binascii
import json
import os
import socket
import struct
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import torch

from r3.batch import Batch, batch_from_samples
from r3.fsdp import gather_full_state_dict, is_distributed
from r3.hf import save_pretrained
from r3.io import atomic_write
from r3.engine_formats import EngineSample, sglang_sample, vllm_routes
from r3.errors import InputError

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost must not go through a proxy
_NPY_DTYPES = {"|u1": torch.uint8, "|i1": torch.int8, "<u2": torch.uint16, "<i2": torch.int16, "<i4": torch.int32,
               "<i8": torch.int64}


class RemoteEngineError(InputError, RuntimeError):
    """A remote engine request failed or answered something unusable. The message names the request; `status` is
    the HTTP status when there was one."""

    def __init__(self, msg: str, status: int | None = None):
        super().__init__(msg)
        self.status = status


def _server_message(obj, raw: bytes) -> str:
    """The error text SGLang / vLLM / FastAPI put in an error body, else the body itself (truncated)."""
    if isinstance(obj, dict):
        err = obj.get("error")
        for m in ((err.get("message") if isinstance(err, dict) else err), obj.get("message"), obj.get("detail")):
            if m:
                return str(m)
    return raw[:300].decode("utf-8", "replace")


class RemoteEngine:
    """Shared HTTP, seeding, checks and weight writing; subclasses speak one server's protocol."""
    kind = "remote"

    def __init__(self, url: str, cfg, *, weights_dir: str | None = None, weights_dtype: torch.dtype = torch.bfloat16,
                 timeout: float = 600.0, connect_wait: float = 60.0):
        if cfg.dense:
            raise ValueError("a remote engine returns routes for R3; the model config is dense")
        self.url, self.cfg = url.rstrip("/"), cfg
        self.weights_dir, self.weights_dtype = weights_dir, weights_dtype
        self.timeout, self.connect_wait = timeout, connect_wait
        self.syncs, self.rollout_dtype, self.last_sync = 0, None, {}

    @property
    def weights_path(self) -> str | None:
        return None if self.weights_dir is None else os.path.join(self.weights_dir, "policy")

    # ---- HTTP -----------------------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body=None, *, what: str, timeout: float | None = None,
                expect_json: bool = True):
        """One HTTP exchange; refused connections are retried for up to `connect_wait` seconds (start-up)."""
        name = f"{method} {self.url}{path} ({what})"
        timeout = self.timeout if timeout is None else timeout
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        deadline, delay = time.monotonic() + self.connect_wait, 0.1
        while True:
            try:
                with _NO_PROXY.open(req, timeout=timeout) as r:
                    status, raw = r.status, r.read()
                break
            except urllib.error.HTTPError as e:
                status, raw = e.code, e.read()
                break
            except urllib.error.URLError as e:
                if isinstance(e.reason, ConnectionRefusedError) and time.monotonic() < deadline:
                    time.sleep(delay)
                    delay = min(2 * delay, 2.0)
                    continue
                if isinstance(e.reason, (TimeoutError, socket.timeout)):
                    raise RemoteEngineError(f"{name}: no answer within {timeout:g} s (timeout)") from e
                raise RemoteEngineError(f"{name}: cannot reach the server ({e.reason}); waited "
                                        f"{self.connect_wait:g} s for it. Is it running, on this address?") from e
            except (TimeoutError, socket.timeout) as e:
                raise RemoteEngineError(f"{name}: no answer within {timeout:g} s (timeout)") from e
            except (ConnectionError, OSError) as e:  # reset / dropped mid-answer
                raise RemoteEngineError(f"{name}: the connection failed mid-request ({e!r})") from e
        obj = None
        if expect_json or status >= 400:
            try:
                obj = json.loads(raw)
            except ValueError:
                if status < 400:
                    raise RemoteEngineError(f"{name}: HTTP {status} but the body is not JSON: {raw[:200]!r}") from None
        if status >= 400:
            raise RemoteEngineError(f"{name}: HTTP {status}: {_server_message(obj, raw)}", status)
        return obj if expect_json else raw

    def wait_ready(self) -> None:
        """Block until GET /health answers 200: refused connections and 503 (still loading) are retried for
        `connect_wait` seconds."""
        deadline = time.monotonic() + self.connect_wait
        while True:
            try:
                self.request("GET", "/health", what="health check", timeout=min(self.timeout, 30.0), expect_json=False)
                return
            except RemoteEngineError as e:
                if e.status != 503 or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    # ---- weights --------------------------------------------------------------------------------------------------
    def sync(self, model) -> None:
        """Write the trainer's weights in HF layout (`weights_dtype`) atomically to `weights_path`, then have the
        server load them. Under torchrun every rank calls this; rank 0 writes and posts, and a failure there is
        raised on every rank (never a silent step on stale weights)."""
        if self.weights_dir is None:
            raise RemoteEngineError(f"{self.kind} engine at {self.url}: weight sync needs weights_dir, a folder the "
                                    f"server can read")
        sd = gather_full_state_dict(model, rank0_only=True)  # collective under FSDP
        err = None
        if not is_distributed() or torch.distributed.get_rank() == 0:
            try:
                t0 = time.perf_counter()
                atomic_write(self.weights_path,
                             lambda tmp: save_pretrained(model, tmp, state_dict=sd, dtype=self.weights_dtype))
                t1 = time.perf_counter()
                self._load_weights(self.weights_path, version=self.syncs + 1)
                size = sum(e.stat().st_size for e in os.scandir(self.weights_path))
                self.last_sync = dict(bytes=size, write_s=t1 - t0, load_s=time.perf_counter() - t1)
            except Exception as e:  # noqa: BLE001 -- re-raised below, on every rank
                if not is_distributed():
                    raise
                err = f"{type(e).__name__}: {e}"
        if is_distributed():
            box = [err]
            torch.distributed.broadcast_object_list(box, src=0)
            if box[0] is not None:
                raise RemoteEngineError(f"weight sync failed on rank 0: {box[0]}")
        self.syncs += 1

    def _load_weights(self, path: str, version: int) -> None:
        raise NotImplementedError

    # ---- generation -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, eos_ids: tuple[int, ...], pad_id: int,
                 group_size: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, keep_logp_V: bool = False) -> Batch:
        """Sample `group_size` responses per prompt on the server; a Batch laid out as `Engine.generate` does.

        One seed per sample (per prompt for vLLM) is drawn from `generator`, so a seeded run against a
        deterministic server is reproducible. Servers return the sampled token's log-prob only: `keep_logp_V` is
        accepted for the in-process engine's signature, but no full-vocabulary log-probs come back (kl_full is None)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs at least one prompt and no empty prompt")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy, as SGLang and vLLM do it), got {temperature}")
        P, G = len(prompts), group_size
        seeds = torch.randint(0, 2 ** 31 - 1, (P * G,), generator=generator).tolist()
        sp = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                  stop_token_ids=[int(t) for t in eos_ids])
        t0 = time.perf_counter()
        samples, name = self._samples([[int(t) for t in p] for p in prompts], seeds, G, sp)
        for i, s in enumerate(samples):
            self._check(s, f"{name}: sample {i} (prompt {i // G})", max_new_tokens, eos_ids)
        meta = dict(engine=self.kind, server=self.url, rollout_dtype=self.rollout_dtype, group_size=G,
                    temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, weight_syncs=self.syncs,
                    generate_s=time.perf_counter() - t0)
        return batch_from_samples(samples, self.cfg, pad_id=pad_id, meta=meta)

    def _samples(self, prompts, seeds, G, sp) -> tuple[list[EngineSample], str]:
        raise NotImplementedError

    def _check(self, s: EngineSample, where: str, max_new_tokens: int, eos_ids) -> None:
        n, V = len(s.output_ids), self.cfg.vocab_size
        if not 1 <= n <= max_new_tokens:
            raise RemoteEngineError(f"{where}: {n} output tokens, asked for 1..{max_new_tokens}")
        if any(not 0 <= t < V for t in s.output_ids):
            raise RemoteEngineError(f"{where}: output token ids outside the vocabulary [0, {V}): {s.output_ids}")
        stops = [j for j, t in enumerate(s.output_ids) if t in eos_ids]
        if stops and stops[0] != n - 1:
            raise RemoteEngineError(f"{where}: tokens after the stop token at {stops[0]} (of {n}): the server "
                                    f"ignored stop_token_ids")
        if s.output_logp is None or len(s.output_logp) != n:
            have = None if s.output_logp is None else len(s.output_logp)
            raise RemoteEngineError(f"{where}: {have} engine log-probs for {n} output tokens")
        if not torch.isfinite(torch.tensor(s.output_logp, dtype=torch.float64)).all():
            raise RemoteEngineError(f"{where}: non-finite engine log-probs {s.output_logp}")


class SGLangEngine(RemoteEngine):
    kind = "sglang"

    def wait_ready(self) -> None:
        super().wait_ready()
        try:  # best effort: the serving dtype, for batch.meta
            info = self.request("GET", "/get_server_info", what="server info", timeout=30.0)
            self.rollout_dtype = info.get("dtype") if isinstance(info, dict) else None
        except RemoteEngineError:
            self.rollout_dtype = None

    def _load_weights(self, path: str, version: int) -> None:
        what = f"model_path={path}"
        out = self.request("POST", "/update_weights_from_disk",
                           dict(model_path=path, flush_cache=True, weight_version=str(version)), what=what)
        if not isinstance(out, dict) or out.get("success") is not True:
            raise RemoteEngineError(f"POST {self.url}/update_weights_from_disk ({what}): the server did not load the "
                                    f"weights: {_server_message(out, json.dumps(out).encode())}")

    def _samples(self, prompts, seeds, G, sp):
        ids = [p for p in prompts for _ in range(G)]
        body = dict(input_ids=ids, sampling_params=[dict(sp, sampling_seed=s) for s in seeds], return_logprob=True,
                    return_routed_experts=True)
        what = f"{len(prompts)} prompts x {G} samples"
        name = f"POST {self.url}/generate ({what})"
        out = self.request("POST", "/generate", body, what=what)
        if not isinstance(out, list) or len(out) != len(ids):
            got = f"a list of {len(out)}" if isinstance(out, list) else type(out).__name__
            raise RemoteEngineError(f"{name}: expected a list of {len(ids)} results, got {got}")
        samples = []
        for i, (p, r) in enumerate(zip(ids, out)):
            try:
                if not isinstance(r, dict) or not isinstance(r.get("meta_info"), dict):
                    raise ValueError(f"no meta_info in {str(r)[:200]}")
                s = sglang_sample(p, r, self.cfg, group=i // G)
                lp = r["meta_info"].get("output_token_logprobs")
                if lp is not None and [int(x[1]) for x in lp] != s.output_ids:
                    raise ValueError("output_token_logprobs name other token ids than output_ids")
            except (ValueError, TypeError, KeyError, IndexError) as e:  # RoutesError is a ValueError
                raise RemoteEngineError(f"{name}: result {i} (prompt {i // G}): {e}") from e
            samples.append(s)
        return samples, name


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

    def __init__(self, url: str, cfg, *, model_name: str | None = None, **kw):
        super().__init__(url, cfg, **kw)
        self.model_name = model_name

    def wait_ready(self) -> None:
        super().wait_ready()
        if self.model_name is None:
            out = self.request("GET", "/v1/models", what="model list", timeout=30.0)
            try:
                self.model_name = out["data"][0]["id"]
            except (KeyError, IndexError, TypeError) as e:
                raise RemoteEngineError(f"GET {self.url}/v1/models: no model id in {str(out)[:200]}") from e

    def _load_weights(self, path: str, version: int) -> None:
        self.request("POST", "/collective_rpc", dict(method="reload_weights"),
                     what=f"reload_weights from the server's model path; needs VLLM_SERVER_DEV_MODE=1 and vLLM "
                          f"started on {path}")
        self.request("POST", "/reset_prefix_cache", what="drop KV computed with the old weights", expect_json=False)

    def _samples(self, prompts, seeds, G, sp):
        if self.model_name is None:
            self.wait_ready()
        P = len(prompts)

        def one(j):
            body = dict(model=self.model_name, prompt=prompts[j], n=G, seed=seeds[j * G],
                        max_tokens=sp["max_new_tokens"], temperature=sp["temperature"], top_p=sp["top_p"],
                        stop_token_ids=sp["stop_token_ids"], logprobs=0, return_token_ids=True)
            return self.request("POST", "/v1/completions", body, what=f"prompt {j} of {P}, n={G}")

        with ThreadPoolExecutor(max_workers=min(P, 16)) as pool:
            outs = list(pool.map(one, range(P)))
        samples = []
        for j, out in enumerate(outs):
            name = f"POST {self.url}/v1/completions (prompt {j} of {P}, n={G})"
            try:
                samples += self._parse(prompts[j], out, G, j)
            except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
                raise RemoteEngineError(f"{name}: {e}") from e
        return samples, f"POST {self.url}/v1/completions ({P} prompts x {G} samples)"

    def _parse(self, prompt, out, G, j) -> list[EngineSample]:
        choices = sorted(out["choices"], key=lambda c: c["index"])
        if len(choices) != G:
            raise ValueError(f"{len(choices)} choices for n={G}")
        prompt_routes = _wire_routes(out.get("prompt_routed_experts"), "prompt_routed_experts")
        samples = []
        for c in choices:
            ids = c.get("token_ids")
            if ids is None:
                raise ValueError(f"choice {c['index']} has no token_ids (vLLM >= 0.10.2 returns them with "
                                 f"return_token_ids=true)")
            lp = (c.get("logprobs") or {}).get("token_logprobs")
            routes = vllm_routes(prompt_routes, _wire_routes(c.get("routed_experts"), "routed_experts"), self.cfg,
                                 n_prompt=len(prompt), n_output=len(ids), where=f"choice {c['index']}")
            samples.append(EngineSample(list(prompt), [int(t) for t in ids], routes,
                                        None if lp is None else [float(x) for x in lp], group=j))
        return samples


ENGINES = {"sglang": SGLangEngine, "vllm": VLLMEngine}


def make_engine(spec: str, cfg, *, wait: bool = True, **kw) -> RemoteEngine:
    """'sglang:URL' or 'vllm:URL' -> a remote engine for a model with config `cfg`; waits for /health by default.
    Keywords go to the engine: weights_dir, weights_dtype, timeout, connect_wait (vLLM: model_name)."""
    kind, sep, url = spec.partition(":")
    if not sep or kind not in ENGINES or not url.startswith(("http://", "https://")):
        raise ValueError(f"engine {spec!r}: expected sglang:http://HOST:PORT or vllm:http://HOST:PORT")
    engine = ENGINES[kind](url, cfg, **kw)
    if wait:
        engine.wait_ready()
    return engine
