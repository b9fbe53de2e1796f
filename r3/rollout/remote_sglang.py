"""The SGLang client: `/generate` with routes and log-probs, weight loads from disk, aborts. Facts from SGLang's source:

  request   POST /generate {"input_ids": [...], "sampling_params": [{"max_new_tokens", "temperature", "top_p",
            "stop_token_ids", "sampling_seed"}, ...], "return_logprob": true, "return_routed_experts": true,
            "rid": [...]}: one entry per sample (each prompt G times, prompt-major), each with its own seed and
            request id (managers/io_struct.py `GenerateReqInput`: a list `rid` must have one id per entry).
            SGLang uses `sampling_seed` only with `--enable-deterministic-inference` (sampling_batch_info.py:
            `sampling_seed = ... if enable_deterministic else None`); without it seeds are silently dropped, so the
            client warns once when /get_server_info reports `enable_deterministic_inference` false.
  response  a list of {"output_ids", "meta_info": {"output_token_logprobs": [[logprob, id, text], ...],
            "routed_experts": base64, "routed_experts_dtype"?, "weight_version"}}, decoded by
            `r3.rollout.engine_formats.sglang_sample`; a weight_version other than the one pushed last is refused.
  abort     POST /abort_request {"rid"} (entrypoints/http_server.py, `AbortReq`); the tokenizer manager aborts
            only a rid it holds exactly, so a timed-out request is aborted one rid at a time, then sent again
            with fresh ids.
  weights   POST /update_weights_from_disk {"model_path", "flush_cache", "weight_version"} -> {"success",
            "message", "num_paused_requests"}, HTTP 400 when it fails; then GET /get_weight_version
            {"weight_version"} must name the version just pushed (skipped where the route does not exist).
  info      GET /get_server_info: the server's arguments (`dtype`, `model_path`, `enable_deterministic_inference`).
            `dtype` "auto" is resolved from the served model's config.json where it is readable here.
  check     the post-sync weight check's probe: POST /generate {"input_ids": [...], "sampling_params":
            {"max_new_tokens": 1, "temperature": 0}, "return_logprob": true, "logprob_start_len": 0}; read
            meta_info.input_token_logprobs, [logprob, id, text] per input token, the first logprob null
            (scheduler_output_processor_mixin.py: `[None] + input_token_logprobs[:-1]`), ids checked against the probe.
"""
import json
import uuid

from r3.rollout.engine_formats import sglang_sample
from r3.rollout.remote_engine import RemoteEngine, resolve_auto_dtype
from r3.rollout.remote_http import RemoteEngineError, server_message


class SGLangEngine(RemoteEngine):
    kind = "sglang"

    def __init__(self, urls, cfg, **kw):
        super().__init__(urls, cfg, **kw)
        self.info, self.dtypes, self._warned = {}, {}, False

    def wait_ready(self) -> None:
        super().wait_ready()
        for s in self.servers:
            self._read_info(s)

    def _read_info(self, server) -> None:
        try:
            info = server.call("GET", "/get_server_info", what="server info", timeout=30.0)
        except RemoteEngineError as e:
            if e.status in (404, 405):  # an older SGLang, or a stand-in without the route: nothing to check
                return
            raise
        if not isinstance(info, dict):
            return
        self.info[server.url] = info
        if info.get("enable_deterministic_inference") is False and not self._warned:
            self._warned = True
            server.log(f"warning: SGLang at {server.url} runs without --enable-deterministic-inference: it ignores "
                f"sampling_seed, so sampling is not reproducible (restart it with that flag for seeded runs)")
        dtype, (readable, config_dtype) = info.get("dtype"), self.served_config(server, info.get("model_path"))
        if dtype == "auto" and readable:
            dtype = resolve_auto_dtype(config_dtype)
        self.rollout_dtype = self.dtypes[server.url] = dtype if isinstance(dtype, str) else None

    def server_dtype(self, server):
        return self.dtypes.get(server.url)

    def _score(self, server, seqs):
        what = f"weight check: input log-probs of {len(seqs)} probe sequences"
        tag = uuid.uuid4().hex[:12]
        out = server.call("POST", "/generate", dict(input_ids=seqs, sampling_params=dict(max_new_tokens=1,
                          temperature=0.0), return_logprob=True, logprob_start_len=0,
                          rid=[f"r3-check-{tag}_{i}" for i in range(len(seqs))]), what=what)
        try:
            rows = [r["meta_info"]["input_token_logprobs"] for r in out]
            if len(rows) != len(seqs) or any([int(x[1]) for x in r] != s or r[0][0] is not None
                                             for r, s in zip(rows, seqs)):
                raise ValueError("input_token_logprobs do not name the probe's tokens, first logprob null")
            return [[x[0] for x in r[1:]] for r in rows]
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise RemoteEngineError(f"POST {server.url}/generate ({what}): {e}: {str(out)[:200]}") from e

    def _load_weights(self, server, path: str, version: str) -> None:
        what = f"model_path={path}, weight_version={version}"
        out = server.call("POST", "/update_weights_from_disk", dict(model_path=path, flush_cache=True,
                                                                    weight_version=version), what=what)
        if not isinstance(out, dict) or out.get("success") is not True:
            raise RemoteEngineError(f"POST {server.url}/update_weights_from_disk ({what}): the server did not load "
                                    f"the weights: {server_message(out, json.dumps(out).encode())}")
        try:
            got = server.call("GET", "/get_weight_version", what="weight version after the load", timeout=30.0)
        except RemoteEngineError as e:
            if e.status in (404, 405):
                return
            raise
        if isinstance(got, dict) and str(got.get("weight_version")) != version:
            raise RemoteEngineError(f"GET {server.url}/get_weight_version: {got.get('weight_version')!r} after "
                                    f"loading version {version!r}: the server did not switch to the new weights")

    def _chunk(self, server, prompts, seeds, G, sp, *, first, what):
        ids = [p for p in prompts for _ in range(G)]
        params = [dict(sp, sampling_seed=s) for s in seeds]
        tag = uuid.uuid4().hex[:12]

        def body(attempt):
            return dict(input_ids=ids, sampling_params=params, return_logprob=True, return_routed_experts=True,
                        rid=[f"r3-{tag}-{attempt}_{i}" for i in range(len(ids))])
        name = f"POST {server.url}/generate ({what})"
        out = server.call("POST", "/generate", what=what, attempt_body=body,
                          on_timeout=lambda b: self._abort(server, b["rid"]))
        if not isinstance(out, list) or len(out) != len(ids):
            got = f"a list of {len(out)}" if isinstance(out, list) else type(out).__name__
            raise RemoteEngineError(f"{name}: expected a list of {len(ids)} results, got {got}")
        samples = []
        for i, (p, r) in enumerate(zip(ids, out)):
            where = f"{name}: result {i} (prompt {first + i // G})"
            try:
                if not isinstance(r, dict) or not isinstance(r.get("meta_info"), dict):
                    raise ValueError(f"no meta_info in {str(r)[:200]}")
                s = sglang_sample(p, r, self.cfg, group=first + i // G, require_routes=self.require_routes)
                lp = r["meta_info"].get("output_token_logprobs")
                if lp is not None and [int(x[1]) for x in lp] != s.output_ids:
                    raise ValueError("output_token_logprobs name other token ids than output_ids")
            except (ValueError, TypeError, KeyError, IndexError) as e:  # RoutesError is a ValueError
                raise RemoteEngineError(f"{where}: {e}") from e
            self.check_version(r["meta_info"].get("weight_version"), where)
            samples.append(s)
        return samples, name

    def _abort(self, server, rids: list[str]) -> None:
        """Best effort: a server that cannot take the abort is about to be retried anyway."""
        for rid in rids:
            try:
                server.exchange("POST", "/abort_request", dict(rid=rid), what=f"abort {rid}", timeout=30.0,
                                expect_json=False)
            except RemoteEngineError as e:
                server.log(f"note: could not abort {rid} ({e})")
                return
