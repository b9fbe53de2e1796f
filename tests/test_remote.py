"""What this proves: over HTTP, the SGLang client (r3/remote.py) gets exactly the routes the server's engine recorded,
R3 replay of an fp32 server's batch against the same weights gives kl ~ 0, weight sync really changes what the server
samples (and syncing back reproduces the first samples, seed for seed), the vLLM client reads the split and combined
route layouts, and a down, slow or misbehaving server is refused with an error that names the request."""
import base64
import io
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from r3.model import PRESETS, build_model
from r3.remote import RemoteEngineError, SGLangEngine, make_engine
from r3.score import old_policy_pass
from r3.serve import SGLangStandIn

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


def get_json(url):
    import urllib.request
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as r:
        return json.loads(r.read())


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
        status, payload, delay = self.server.reply(self.command, self.path, body)
        self.server.calls.append((self.command, self.path, body))
        time.sleep(delay)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer(None)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(json.loads(raw) if raw else None)


@pytest.fixture()
def fake():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeHandler)
    httpd.daemon_threads, httpd.calls = True, []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


STAND_IN = SGLangStandIn(sharp(1), rollout_dtype="fp32", seed=0, weights_root=None, desc="fake")
STAND_IN_LOCK = threading.Lock()  # the vLLM client sends prompts concurrently; last_routes must be its own


def sglang_reply(corrupt=None, status=200, delay=0.0):
    def reply(method, path, body):
        if path != "/generate":
            return 200, {}, 0.0
        out = STAND_IN.generate(body)
        if corrupt is not None:
            out = corrupt(out)
        return status, out, delay
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


def test_http_errors_timeouts_and_a_down_server(fake, tmp_path):
    url = f"http://127.0.0.1:{fake.server_port}"
    fake.reply = sglang_reply(lambda out: {"error": {"message": "CUDA out of memory"}}, status=500)
    with pytest.raises(RemoteEngineError, match=r"/generate \(3 prompts x 2 samples\): HTTP 500: CUDA out of mem"):
        SGLangEngine(url, CFG).generate(PROMPTS, **GEN)
    fake.reply = sglang_reply(delay=1.5)
    with pytest.raises(RemoteEngineError, match=r"/generate .*timeout"):
        SGLangEngine(url, CFG, timeout=0.3).generate(PROMPTS, **GEN)
    fake.reply = lambda m, p, b: (400, {"success": False, "message": "Failed to load: shape mismatch"}, 0.0)
    with pytest.raises(RemoteEngineError, match=r"update_weights_from_disk .*HTTP 400: Failed to load: shape mism"):
        SGLangEngine(url, CFG, weights_dir=str(tmp_path)).sync(sharp(1))
    fake.reply = lambda m, p, b: (200, {"success": False, "message": "weights are stale"}, 0.0)
    with pytest.raises(RemoteEngineError, match=r"did not load the weights: weights are stale"):
        SGLangEngine(url, CFG, weights_dir=str(tmp_path)).sync(sharp(1))
    port = fake.server_port
    fake.shutdown()
    fake.server_close()
    t0 = time.monotonic()
    with pytest.raises(RemoteEngineError, match=rf"POST http://127.0.0.1:{port}/generate .*cannot reach the server"):
        SGLangEngine(f"http://127.0.0.1:{port}", CFG, connect_wait=0.5).generate(PROMPTS, **GEN)
    assert 0.4 < time.monotonic() - t0 < 10  # retried a refused connection for connect_wait, then gave up
    with pytest.raises(ValueError, match="sglang:http"):
        make_engine("sglang://nohost", CFG)


def test_health_waits_while_the_server_loads(fake):
    answers = iter([(503, {"message": "loading"}, 0.0)] * 2 + [(200, b"", 0.0)] * 10)
    fake.reply = lambda m, p, b: next(answers) if p == "/health" else (200, {"dtype": "bfloat16"}, 0.0)
    eng = make_engine(f"sglang:http://127.0.0.1:{fake.server_port}", CFG, connect_wait=10)
    assert eng.rollout_dtype == "bfloat16" and [c[1] for c in fake.calls[:3]] == ["/health"] * 3
    fake.reply = lambda m, p, b: (503, {"message": "loading"}, 0.0)
    with pytest.raises(RemoteEngineError, match=r"GET .*/health \(health check\): HTTP 503: loading"):
        make_engine(f"sglang:http://127.0.0.1:{fake.server_port}", CFG, connect_wait=0)


# ---- vLLM's OpenAI server -----------------------------------------------------------------------------------------

def npy_b64(rows):
    buf = io.BytesIO()
    np.save(buf, np.asarray(rows, dtype=np.uint8))
    return base64.b64encode(buf.getvalue()).decode()


def vllm_reply(layout, corrupt=None):
    def reply(method, path, body):
        if path == "/v1/models":
            return 200, {"data": [{"id": "toy"}]}, 0.0
        if path != "/v1/completions":
            return 200, {"results": []}, 0.0
        P, G = len(body["prompt"]), body["n"]
        sp = dict(max_new_tokens=body["max_tokens"], temperature=body["temperature"], top_p=body["top_p"],
                  stop_token_ids=body["stop_token_ids"], n=G, sampling_seed=body["seed"])
        with STAND_IN_LOCK:
            outs = STAND_IN.generate(dict(input_ids=[body["prompt"]], sampling_params=sp, return_logprob=True))
            rec = STAND_IN.last_routes
        choices = [dict(index=c, text="", token_ids=o["output_ids"], finish_reason="stop",
                        logprobs=dict(token_logprobs=[x[0] for x in o["meta_info"]["output_token_logprobs"]]),
                        routed_experts=(npy_b64(rec[c][P:]) if layout == "split" else rec[c]))
                   for c, o in enumerate(outs)]
        resp = dict(id="cmpl-1", object="text_completion", model="toy", choices=choices[::-1],
                    prompt_routed_experts=rec[0][:P] if layout == "split" else None)
        return 200, resp if corrupt is None else corrupt(resp), 0.0
    return reply


@pytest.mark.parametrize("layout", ["split", "combined"])
def test_vllm_layouts_give_the_sglang_batch(fake, layout):
    url = f"http://127.0.0.1:{fake.server_port}"
    fake.reply = sglang_reply()
    one = dict(GEN, group_size=1)  # G = 1: vLLM seeds a prompt's n children seed + i, SGLang each entry
    ref = SGLangEngine(url, CFG).generate(PROMPTS, generator=torch.Generator().manual_seed(0), **one)
    fake.reply = vllm_reply(layout)
    eng = make_engine("vllm:" + url, CFG)
    got = eng.generate(PROMPTS, generator=torch.Generator().manual_seed(0), **one)
    assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.routes, ref.routes)
    assert torch.allclose(got.rollout_logp, ref.rollout_logp) and got.meta["engine"] == "vllm"
    assert fake.calls[-1][2]["return_token_ids"] and fake.calls[-1][2]["model"] == "toy"


def test_bad_vllm_answers_and_weight_reload(fake, tmp_path):
    url = f"http://127.0.0.1:{fake.server_port}"
    def extra_row(r):
        for c in r["choices"]:
            c["routed_experts"] = c["routed_experts"] + c["routed_experts"][-1:]
        return r

    def no_token_ids(r):
        for c in r["choices"]:
            c.pop("token_ids")
        return r
    fake.reply = vllm_reply("combined", extra_row)
    with pytest.raises(RemoteEngineError, match=r"v1/completions \(prompt 0 of 3, n=2\): .*need either"):
        make_engine("vllm:" + url, CFG).generate(PROMPTS, **GEN)
    fake.reply = vllm_reply("split", no_token_ids)
    with pytest.raises(RemoteEngineError, match="no token_ids"):
        make_engine("vllm:" + url, CFG).generate(PROMPTS, **GEN)
    fake.reply = vllm_reply("split")
    eng = make_engine("vllm:" + url, CFG, weights_dir=str(tmp_path))
    eng.sync(sharp(1))
    assert [c[1] for c in fake.calls[-2:]] == ["/collective_rpc", "/reset_prefix_cache"]
    assert fake.calls[-2][2] == {"method": "reload_weights"} and os.path.exists(eng.weights_path + "/config.json")
