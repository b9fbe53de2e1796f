"""A stand-in server that speaks SGLang's HTTP protocol, backed by our in-process `r3.rollout.engine.Engine`.

    python -m r3.serve --weights-root /tmp/r3-weights
    -> prints one line, "r3.serve ready on http://127.0.0.1:30000", once its port is open

It serves what `python train.py` trains by default (`--task`, the preset widened to its vocabulary, the same cached
warm-up via `r3.train.warmup.load_model`), so train.py's first weight sync fits. A stand-in for SGLang so that the
remote R3 loop (r3/rollout/remote*.py) runs end to end on a CPU: it implements the subset of SGLang's payloads the
client sends, the same way:
  GET  /health                     200 "ok"
  GET  /get_server_info            {"dtype": rollout dtype, "model_path", "weight_version",
                                   "enable_deterministic_inference": true, ...}
  GET  /get_weight_version         {"weight_version"}
  POST /generate                   input_ids (a list, or a list of lists), sampling_params (one dict, or one per entry:
                                   temperature, top_p, max_new_tokens, stop_token_ids, n, sampling_seed), rid,
                                   return_logprob, logprob_start_len (S >= 0: input_token_logprobs too, SGLang's
                                   [logprob, id, null] for ids[S:], the first null), return_routed_experts,
                                   routed_experts_start_len. A list input gets a list of {"text", "output_ids",
                                   "meta_info"} back, entry-major (n per entry).
  POST /abort_request              {"rid"}: recorded (and ends a stalled request, below)
  POST /update_weights_from_disk   {"model_path", "flush_cache", "weight_version"} -> {"success", "message",
                                   "num_paused_requests"}; HTTP 400 with success false when it cannot load them
  GET  /r3_debug/last_routes       (ours) the routes the engine recorded for each result of the last /generate
  GET  /r3_debug/stats             (ours) the rids of every /generate, the aborted rids, the weight versions loaded
Sampling: the entries of one request that share their sampling parameters are generated as one batch, from one
generator seeded by their `sampling_seed`s (unseeded requests: the server's generator, seeded by --seed). The same
request gets the same samples every time; a sample depends on its whole request (like batch-variant serving), not on
its seed alone.
Test-only switches (labelled so in --help): answer 503 to the first N requests (--test-unavailable), let the first
sampling /generate requests hang until aborted (--test-stall), serve misread experts after every weight load while
answering it with success (--test-corrupt-reload: vLLM 0.32's CPU reload bug, emulated). They count requests, not
seconds, so a test built on them passes however slowly its machine runs. Two servers are two processes.
Safety: binds 127.0.0.1 unless told otherwise; loads weights from safetensors only (`r3.scale.hf.load_pretrained`) and
only from inside --weights-root (symlinks resolved; a --weights-root that does not exist is refused at start;
without it no path is loaded). Connections are handled on threads; generation and weight loading hold one lock.
Left out: text prompts and a tokenizer, streaming, top_k / min_p / penalties, top logprobs, sessions.
"""
import argparse
import base64
import json
import os
import sys
import threading
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from r3.train.config import INT_GE0, PORT, POSITIVE, THREADS, SamplingConfig, check_flags
from r3.rollout.engine import ROLLOUT_DTYPES, Engine
from r3.errors import run_main
from r3.scale.hf import CheckpointError, load_pretrained
from r3.model.model import PRESETS
from r3.tasks.tasks import make_task
from r3.train.warmup import load_model

WIRE_DTYPES = {"int32": torch.int32, "uint16": torch.uint16, "uint8": torch.uint8}


class BadRequest(ValueError):
    """The request cannot be served as sent (HTTP 400); the message says why."""


class ServeError(Exception):
    """The server cannot start as asked (a bad flag, an unreadable model): one line and a non-zero exit."""


class SGLangStandIn:
    """The state behind the handler: one engine, a lock, the weights root, the last results' routes, the stats."""

    def __init__(self, model, *, rollout_dtype: str, seed: int, weights_root: str | None, desc: str,
                 routes_dtype: str = "int32", model_path: str | None = None, unavailable: int = 0,
                 stall: int = 0, stall_max_s: float = 120.0, corrupt_reload: bool = False):
        self.engine, self.cfg, self.desc, self.model_path = Engine(model, rollout_dtype), model.cfg, desc, model_path
        self.lock, self.stats_lock = threading.Lock(), threading.Lock()
        self.aborted = threading.Condition(self.stats_lock)  # notified at every /abort_request (ends a stall)
        self.generator = torch.Generator().manual_seed(seed)
        self.weights_root = None if weights_root is None else os.path.realpath(weights_root)
        self.routes_dtype, self.version, self.last_routes = routes_dtype, "0", []
        self.stall, self.stall_max_s, self.unavailable_left = stall, stall_max_s, unavailable
        self.corrupt_reload = corrupt_reload
        self.stats = dict(generate_rids=[], aborted=[], weight_versions=[], unavailable_answers=0, samples=0)

    def info(self) -> dict:
        return dict(dtype=self.engine.dtype_name, model_path=self.model_path, model=self.desc,
                    weight_version=self.version, enable_deterministic_inference=True,
                    weights_root=self.weights_root, num_experts=self.cfg.num_experts)

    def unavailable(self) -> bool:
        """True for the first --test-unavailable requests (each is answered 503, as by a loading server)."""
        with self.stats_lock:
            if self.unavailable_left <= 0:
                return False
            self.unavailable_left -= 1
            self.stats["unavailable_answers"] += 1
        return True

    # ---- /generate ------------------------------------------------------------------------------------------------
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
        start = int(body.get("routed_experts_start_len", 0) or 0)
        batches = {}  # entries that share their sampling parameters are generated together
        for i, s in enumerate(sps):
            batches.setdefault(_params(s), []).append(i)
        per_entry = [None] * len(entries)
        with self.lock:
            for key, idx in batches.items():
                outs = self._batch([entries[i] for i in idx], [sps[i] for i in idx], key, start, body)
                for i, out in zip(idx, outs):
                    per_entry[i] = out
            flat = [r for out in per_entry for r in out]
            self.last_routes = [routes for _, routes in flat]
        with self.stats_lock:
            self.stats["samples"] += len(flat)
        results = [r for r, _ in flat]
        return results[0] if single and len(results) == 1 else results

    def _batch(self, prompts: list[list[int]], sps: list[dict], key: tuple, start: int, body: dict) -> list:
        temperature, top_p, max_new, stop, n = key
        for p in prompts:
            if not 0 <= start <= len(p):
                raise BadRequest(f"routed_experts_start_len={start} must be in [0, {len(p)}] (the prompt length)")
        seeds = [s.get("sampling_seed") for s in sps]
        g = self.generator if any(x is None for x in seeds) else \
            torch.Generator().manual_seed(zlib.crc32(json.dumps([int(x) for x in seeds]).encode()))
        try:
            b = self.engine.generate(prompts, max_new_tokens=max_new, eos_ids=stop, pad_id=0, group_size=n,
                                     temperature=temperature, top_p=top_p, generator=g)
        except ValueError as e:
            raise BadRequest(str(e)) from e
        Lp, lp_start = max(len(p) for p in prompts), body.get("logprob_start_len")
        inputs = [self.input_logprobs(p, lp_start) if body.get("return_logprob") and isinstance(lp_start, int)
                  and lp_start >= 0 else None for p in prompts]
        outs = [[] for _ in prompts]
        for r in range(len(b)):
            P = len(prompts[r // n])
            out_ids = b.tokens[r, Lp:][b.response_mask[r, Lp:]].tolist()
            k = len(out_ids)
            logp = b.rollout_logp[r, Lp - 1:Lp - 1 + k].tolist()
            routes = b.routes[r, Lp - P:Lp + k - 1].long()  # input positions of the prompt and the fed outputs
            outs[r // n].append(self._result(P, out_ids, logp, routes, stop, start, body, inputs[r // n]))
        return outs

    @torch.inference_mode()
    def input_logprobs(self, prompt: list[int], start: int) -> list:
        """SGLang's input_token_logprobs ([None] + ...: the first null), log p(x_j | x_<j) by the engine's forward."""
        if not 0 <= start < len(prompt):
            raise BadRequest(f"logprob_start_len={start} must be in [0, {len(prompt) - 1}] (the prompt length - 1)")
        ids = torch.tensor([prompt])
        logits, _ = self.engine.model(ids)
        lp = logits[0, :-1].float().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0].tolist()
        return [[None, prompt[start], None]] + [[lp[j - 1], prompt[j], None] for j in range(start + 1, len(prompt))]

    def _result(self, P: int, out_ids: list[int], logp: list[float], routes: torch.Tensor, stop, start: int,
                body: dict, inputs: list | None):
        n = len(out_ids)
        done = out_ids[-1] in stop
        meta = dict(id=uuid.uuid4().hex, prompt_tokens=P, completion_tokens=n, cached_tokens=0,
                    weight_version=self.version,
                    finish_reason=dict(type="stop", matched=out_ids[-1]) if done else dict(type="length", length=n))
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logp, out_ids)]
        if inputs is not None:
            meta["input_token_logprobs"] = inputs
        if body.get("return_routed_experts"):
            wire = routes[start:].to(WIRE_DTYPES[self.routes_dtype]).contiguous()
            meta["routed_experts"] = base64.b64encode(wire.view(torch.uint8).numpy().tobytes()).decode()
            if self.routes_dtype != "int32":
                meta["routed_experts_dtype"] = self.routes_dtype
            if start:
                meta["routed_experts_start_len"] = start
        return dict(text="", output_ids=out_ids, meta_info=meta), routes.tolist()

    # ---- aborts and the test-only stall ---------------------------------------------------------------------------
    def record(self, body: dict) -> bool:
        """Record a /generate's rids; True for the first --test-stall sampling ones (they hang; scoring ones never)."""
        rid = body.get("rid")
        with self.stats_lock:
            self.stats["generate_rids"].append(rid if isinstance(rid, list) else [rid])
            stall = self.stall > 0 and body.get("logprob_start_len") in (None, -1)
            self.stall -= stall
        return stall

    def hang(self, body: dict) -> None:
        """Hang (without the engine lock) until one of the request's rids is aborted, or stall_max_s pass (only so
        that a client that never aborts cannot hold a thread forever)."""
        rid = body.get("rid")
        rids = set(rid if isinstance(rid, list) else [rid])
        with self.aborted:
            self.aborted.wait_for(lambda: rids & set(self.stats["aborted"]), timeout=self.stall_max_s)

    def snapshot(self) -> dict:
        with self.stats_lock:
            return json.loads(json.dumps(self.stats))

    def abort(self, body: dict) -> None:
        with self.aborted:
            self.stats["aborted"].append(body.get("rid"))
            self.aborted.notify_all()

    # ---- weights --------------------------------------------------------------------------------------------------
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
        if self.corrupt_reload:
            misread_experts(model)
        with self.lock:
            self.engine.sync(model)
            self.version = str(body.get("weight_version") or int(self.version) + 1)
            self.desc = real
        with self.stats_lock:
            self.stats["weight_versions"].append(self.version)
        return 200, dict(success=True, message="Succeeded to update model weights.", num_paused_requests=0)


@torch.no_grad()
def misread_experts(model) -> None:
    """--test-corrupt-reload: each expert matrix misread as vLLM 0.32's CPU kernel reads a reload it did not re-pack."""
    for name, p in model.named_parameters():
        if name.endswith(("gate_proj", "up_proj", "down_proj")) and p.dim() == 3:
            w, (E, N, K) = p.clone(), p.shape
            p.copy_(w.reshape(E, N // 16, K, 16).transpose(2, 3).reshape(E, N, K) if N % 16 == 0 else w.flip(1))


def _params(s: dict) -> tuple:
    """(temperature, top_p, max_new_tokens, stop ids, n) of one entry, validated."""
    temperature, top_p = float(s.get("temperature", 1.0)), float(s.get("top_p", 1.0))
    max_new, n = int(s.get("max_new_tokens", 128)), int(s.get("n", 1) or 1)
    if not temperature >= 0 or not 0 < top_p <= 1 or max_new < 1 or n < 1:
        raise BadRequest(f"need temperature >= 0 (0 = greedy), top_p in (0, 1], max_new_tokens >= 1, n >= 1; got "
                         f"{temperature}, {top_p}, {max_new}, {n}")
    return temperature, top_p, max_new, tuple(int(t) for t in s.get("stop_token_ids") or ()), n


class Handler(BaseHTTPRequestHandler):
    server_version = "r3.serve"

    def log_message(self, fmt, *args):  # quiet unless --verbose
        if self.server.verbose:
            super().log_message(fmt, *args)

    def _send(self, status: int, obj) -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(obj, bytes) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a time-out): nobody to answer
            pass

    def do_GET(self):
        state = self.server.state
        routes = {"/health": lambda: b"ok", "/get_server_info": state.info, "/server_info": state.info,
                  "/get_weight_version": lambda: dict(weight_version=state.version),
                  "/r3_debug/last_routes": lambda: state.last_routes, "/r3_debug/stats": state.snapshot}
        if state.unavailable():
            self._send(503, dict(error=dict(message="the server is starting (r3.serve --test-unavailable)")))
        elif self.path in routes:
            self._send(200, routes[self.path]())
        else:
            self._send(404, dict(error=dict(message=f"no route GET {self.path}")))

    def do_POST(self):
        state = self.server.state
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            if state.unavailable():
                self._send(503, dict(error=dict(message="the server is starting (r3.serve --test-unavailable)")))
            elif self.path == "/generate":
                if state.record(body):
                    state.hang(body)
                self._send(200, state.generate(body))
            elif self.path == "/update_weights_from_disk":
                self._send(*state.update_weights(body))
            elif self.path == "/abort_request":
                state.abort(body)
                self._send(200, b"")
            else:
                self._send(404, dict(error=dict(message=f"no route POST {self.path}")))
        except (BadRequest, ValueError) as e:  # json errors are ValueErrors too
            self._send(400, dict(error=dict(message=str(e))))


def build(args) -> SGLangStandIn:
    """The served model: --model's checkpoint, else the preset for --task, warmed up as train.py does."""
    if args.model is not None:
        if args.preset is not None:
            raise ServeError("give --preset NAME or --model PATH, not both")
        try:
            model = load_pretrained(args.model, dtype=torch.float32)
        except (CheckpointError, OSError) as e:
            raise ServeError(f"--model {args.model}: {e}") from e
        desc = path = os.path.realpath(args.model)
    else:
        try:
            task = make_task(args.task)
        except ValueError as e:
            raise ServeError(f"--task {args.task}: {e}") from e
        model, desc = load_model(args.preset or SamplingConfig.preset, dense=False, task=task, task_spec=args.task,
                                 warmup_steps=args.warmup_steps, init_seed=args.seed, progress=False)
        path = None
    return SGLangStandIn(model.float().eval(), rollout_dtype=args.rollout_dtype, seed=args.seed,
                         weights_root=args.weights_root, desc=desc, routes_dtype=args.routes_dtype, model_path=path,
                         unavailable=args.test_unavailable, stall=args.test_stall, stall_max_s=args.test_stall_max,
                         corrupt_reload=args.test_corrupt_reload)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="A stand-in server speaking SGLang's /generate protocol (r3 engine).")
    ap.add_argument("--task", default=SamplingConfig.task, help=f"the toy task whose vocabulary and warm-up to serve "
                    f"(train.py's --task; default {SamplingConfig.task})")
    ap.add_argument("--preset", choices=sorted(PRESETS), help=f"toy preset (default {SamplingConfig.preset})")
    ap.add_argument("--warmup-steps", type=int, default=SamplingConfig.warmup_steps,
                    help="supervised warm-up steps, as train.py's flag (the same cache; 0 = random init)")
    ap.add_argument("--model", help="serve an HF Qwen3-MoE checkpoint folder (safetensors) instead of a preset")
    ap.add_argument("--rollout-dtype", default="bf16", choices=sorted(ROLLOUT_DTYPES), help="engine precision")
    ap.add_argument("--seed", type=int, default=0, help="init and warm-up seed, as train.py's --seed; also seeds "
                    "requests sent without sampling_seed")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    ap.add_argument("--port", type=int, default=30000, help="port; 0 picks a free one (printed when ready)")
    ap.add_argument("--weights-root", help="an existing folder: the only place /update_weights_from_disk loads from")
    ap.add_argument("--routes-dtype", default="int32", choices=sorted(WIRE_DTYPES),
                    help="dtype of routed_experts on the wire (int32 = SGLang's default)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--verbose", action="store_true", help="log every request")
    t = ap.add_argument_group("test-only switches (for the client's tests; they make the server misbehave)")
    t.add_argument("--test-unavailable", type=int, default=0, metavar="N",
                   help="answer HTTP 503 to the first N requests after the port opens, as a loading server")
    t.add_argument("--test-stall", type=int, default=0, metavar="N",
                   help="the first N sampling /generate requests hang until /abort_request names a rid of theirs")
    t.add_argument("--test-stall-max", type=float, default=120.0, metavar="SECONDS",
                   help="a hung request that is never aborted is answered after SECONDS")
    t.add_argument("--test-corrupt-reload", action="store_true",
                   help="serve every loaded checkpoint's experts misread, answering success (vLLM 0.32's CPU bug)")
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    check_flags(ap, args, dict(port=PORT, threads=THREADS, warmup_steps=INT_GE0, seed=INT_GE0,
                               test_unavailable=INT_GE0, test_stall=INT_GE0, test_stall_max=POSITIVE))
    if args.weights_root is not None and not os.path.isdir(args.weights_root):  # refused before any work
        sys.exit(f"error: --weights-root {args.weights_root}: no such folder (create it: the server loads weights "
                 f"only from inside it)")
    torch.set_num_threads(args.threads)
    try:
        state = build(args)
    except ServeError as e:
        sys.exit(f"error: {e}")
    try:
        httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as e:
        sys.exit(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e}")
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
