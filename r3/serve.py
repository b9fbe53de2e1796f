"""A test server that speaks SGLang's HTTP protocol, backed by our in-process `r3.engine.Engine`.

    python -m r3.serve --preset toy --rollout-dtype fp32 --port 0 --weights-root /tmp/weights
    -> prints one line, "r3.serve ready on http://127.0.0.1:PORT", once it accepts requests

A stand-in for SGLang in tests only, so that the remote R3 loop (r3/remote.py) runs end to end on a CPU. The client
is written against SGLang's payloads; this server implements the subset the client sends, the same way:
  GET  /health                     200 "ok"
  GET  /get_server_info            {"dtype": rollout dtype, "model": where the weights came from, "weight_version"}
  POST /generate                   input_ids (a list, or a list of lists), sampling_params (one dict, or one per entry:
                                   temperature, top_p, max_new_tokens, stop_token_ids, n, sampling_seed),
                                   return_logprob, return_routed_experts, routed_experts_start_len. A list input gets
                                   a list of {"text", "output_ids", "meta_info"} back, entry-major (n per entry).
  POST /update_weights_from_disk   {"model_path", "flush_cache"} -> {"success", "message", "num_paused_requests"};
                                   HTTP 400 with success false when it cannot load them
  GET  /r3_debug/last_routes       (ours, not SGLang's) the routes the engine recorded for each result of the last
                                   /generate, [prompt + output - 1, L, K] nested lists, for tests to compare against
Each sample draws from `torch.Generator().manual_seed(sampling_seed + j)` (j-th of its entry's n), or from the
server's own generator (seeded by --seed) when no seed is sent: a seeded client gets the same samples every time.
Safety: binds 127.0.0.1 unless told otherwise; loads weights from safetensors only (`r3.hf.load_pretrained`) and
only from inside --weights-root (symlinks resolved; without it no path is loaded). Connections are handled on
threads; generation and weight loading hold one lock (one engine).
Left out: text prompts and a tokenizer, streaming, top_k / min_p / penalties, logprob_start_len, greedy decoding
(temperature 0 is refused), sessions, batching across entries (each sample is generated on its own).
"""
import argparse
import base64
import json
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from r3.engine import ROLLOUT_DTYPES, Engine
from r3.errors import run_main
from r3.hf import CheckpointError, load_pretrained
from r3.model import PRESETS, build_model

WIRE_DTYPES = {"int32": torch.int32, "uint16": torch.uint16, "uint8": torch.uint8}


class BadRequest(ValueError):
    """The request cannot be served as sent (HTTP 400); the message says why."""


class SGLangStandIn:
    """The state behind the handler: one engine, a lock, the weights root, the last results' routes."""

    def __init__(self, model, *, rollout_dtype: str, seed: int, weights_root: str | None, desc: str,
                 routes_dtype: str = "int32"):
        self.engine, self.cfg, self.desc = Engine(model, rollout_dtype), model.cfg, desc
        self.lock = threading.Lock()
        self.generator = torch.Generator().manual_seed(seed)
        self.weights_root = None if weights_root is None else os.path.realpath(weights_root)
        self.routes_dtype, self.version, self.last_routes = routes_dtype, "0", []

    def info(self) -> dict:
        return dict(dtype=self.engine.dtype_name, model=self.desc, weight_version=self.version,
                    weights_root=self.weights_root, num_experts=self.cfg.num_experts)

    def generate(self, body: dict):
        if body.get("text") is not None or body.get("input_ids") is None:
            raise BadRequest("this test server takes input_ids only (it has no tokenizer)")
        ids = body["input_ids"]
        single = isinstance(ids, list) and len(ids) > 0 and all(isinstance(t, int) for t in ids)
        entries = [ids] if single else ids
        V = self.cfg.vocab_size
        if not isinstance(entries, list) or not entries or any(
                not isinstance(p, list) or not p or not all(isinstance(t, int) and 0 <= t < V for t in p)
                for p in entries):
            raise BadRequest(f"input_ids must be a non-empty list of token ids in [0, {V}), or a list of such lists")
        sp = body.get("sampling_params") or {}
        sps = sp if isinstance(sp, list) else [sp] * len(entries)
        if len(sps) != len(entries) or not all(isinstance(s, dict) for s in sps):
            raise BadRequest(f"sampling_params: one dict, or one per input ({len(entries)}), got {str(sp)[:200]}")
        start = body.get("routed_experts_start_len", 0) or 0
        out, routes = [], []
        with self.lock:
            for p, s in zip(entries, sps):
                for j in range(int(s.get("n", 1) or 1)):
                    result, r = self._one(p, s, j, int(start), body)
                    out.append(result)
                    routes.append(r)
            self.last_routes = routes
        return out[0] if single and len(out) == 1 else out

    def _one(self, prompt: list[int], s: dict, j: int, start: int, body: dict):
        temperature, top_p = float(s.get("temperature", 1.0)), float(s.get("top_p", 1.0))
        max_new, stop = int(s.get("max_new_tokens", 128)), tuple(int(t) for t in s.get("stop_token_ids") or ())
        if not temperature >= 0 or not 0 < top_p <= 1 or max_new < 1:
            raise BadRequest(f"need temperature >= 0 (0 = greedy), top_p in (0, 1], max_new_tokens >= 1; got "
                             f"{temperature}, {top_p}, {max_new}")
        P = len(prompt)
        if not 0 <= start <= P:
            raise BadRequest(f"routed_experts_start_len={start} must be in [0, {P}] (the prompt length)")
        seed = s.get("sampling_seed")
        g = self.generator if seed is None else torch.Generator().manual_seed(int(seed) + j)
        try:
            b = self.engine.generate([prompt], max_new_tokens=max_new, eos_ids=stop, pad_id=0, group_size=1,
                                     temperature=temperature, top_p=top_p, generator=g)
        except ValueError as e:
            raise BadRequest(str(e)) from e
        out_ids = b.tokens[0, P:][b.response_mask[0, P:]].tolist()
        n = len(out_ids)
        logp = b.rollout_logp[0, P - 1:P - 1 + n].tolist()
        routes = b.routes[0, :P + n - 1].long()
        done = out_ids[-1] in stop
        meta = dict(id=uuid.uuid4().hex, prompt_tokens=P, completion_tokens=n, cached_tokens=0,
                    weight_version=self.version,
                    finish_reason=dict(type="stop", matched=out_ids[-1]) if done else dict(type="length", length=n))
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logp, out_ids)]
        if body.get("return_routed_experts"):
            wire = routes[start:].to(WIRE_DTYPES[self.routes_dtype]).contiguous()
            meta["routed_experts"] = base64.b64encode(wire.view(torch.uint8).numpy().tobytes()).decode()
            if self.routes_dtype != "int32":
                meta["routed_experts_dtype"] = self.routes_dtype
            if start:
                meta["routed_experts_start_len"] = start
        return dict(text="", output_ids=out_ids, meta_info=meta), routes.tolist()

    def update_weights(self, body: dict) -> tuple[int, dict]:
        def fail(msg):
            return 400, dict(success=False, message=msg, num_paused_requests=0)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            return fail("model_path (a folder of safetensors shards + config.json) is required")
        if self.weights_root is None:
            return fail("this server was started without --weights-root, so it loads no weights")
        real = os.path.realpath(path)
        if os.path.commonpath([real, self.weights_root]) != self.weights_root:
            return fail(f"model_path {path!r} is outside --weights-root {self.weights_root!r}; refused")
        try:
            model = load_pretrained(real, dtype=torch.float32)
        except (CheckpointError, OSError, ValueError) as e:
            return fail(f"cannot load {path!r}: {e}")
        if model.cfg != self.cfg:
            return fail(f"{path!r} holds another architecture ({model.cfg}) than the one served ({self.cfg})")
        with self.lock:
            self.engine.sync(model)
            self.version = str(body.get("weight_version") or int(self.version) + 1)
            self.desc = real
        return 200, dict(success=True, message="Succeeded to update model weights.", num_paused_requests=0)


class Handler(BaseHTTPRequestHandler):
    server_version = "r3.serve"

    def log_message(self, fmt, *args):  # quiet unless --verbose
        if self.server.verbose:
            super().log_message(fmt, *args)

    def _send(self, status: int, obj) -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(obj, bytes) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        state = self.server.state
        if self.path == "/health":
            self._send(200, b"ok")
        elif self.path in ("/get_server_info", "/server_info"):
            self._send(200, state.info())
        elif self.path == "/r3_debug/last_routes":
            self._send(200, state.last_routes)
        else:
            self._send(404, dict(error=dict(message=f"no route GET {self.path}")))

    def do_POST(self):
        state = self.server.state
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            if self.path == "/generate":
                self._send(200, state.generate(body))
            elif self.path == "/update_weights_from_disk":
                self._send(*state.update_weights(body))
            else:
                self._send(404, dict(error=dict(message=f"no route POST {self.path}")))
        except (BadRequest, ValueError) as e:  # json errors are ValueErrors too
            self._send(400, dict(error=dict(message=str(e))))


def build(args) -> SGLangStandIn:
    if (args.preset is None) == (args.model is None):
        raise SystemExit("give exactly one of --preset NAME or --model PATH")
    if args.preset is not None:
        model, desc = build_model(PRESETS[args.preset], args.seed), f"preset {args.preset}, init seed {args.seed}"
    else:
        model, desc = load_pretrained(args.model, dtype=torch.float32), os.path.realpath(args.model)
    return SGLangStandIn(model.float().eval(), rollout_dtype=args.rollout_dtype, seed=args.seed,
                         weights_root=args.weights_root, desc=desc, routes_dtype=args.routes_dtype)


def main(argv=None):
    ap = argparse.ArgumentParser(description="A test server speaking SGLang's /generate protocol (r3 engine).")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="serve a toy preset built from --seed")
    ap.add_argument("--model", help="serve an HF Qwen3-MoE checkpoint folder (safetensors)")
    ap.add_argument("--rollout-dtype", default="bf16", choices=sorted(ROLLOUT_DTYPES), help="engine precision")
    ap.add_argument("--seed", type=int, default=0, help="preset init seed; also seeds requests sent without one")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    ap.add_argument("--port", type=int, default=30000, help="port; 0 picks a free one (printed when ready)")
    ap.add_argument("--weights-root", help="the only folder /update_weights_from_disk may load from")
    ap.add_argument("--routes-dtype", default="int32", choices=sorted(WIRE_DTYPES),
                    help="dtype of routed_experts on the wire (int32 = SGLang's default)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--verbose", action="store_true", help="log every request")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    state = build(args)
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads, httpd.state, httpd.verbose = True, state, args.verbose
    host, port = httpd.server_address[:2]
    print(f"r3.serve ready on http://{host}:{port}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


if __name__ == "__main__":
    run_main(main)
