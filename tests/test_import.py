"""What this proves: routes from SGLang (`meta_info.routed_experts`, base64 int32/uint16/uint8, with and without
`routed_experts_start_len`) and vLLM (`CompletionOutput.routed_experts`) land in our Batch at the right input
positions, replay in the trainer, survive save/load, and malformed payloads are refused with errors naming them."""
import base64
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from r3.rollout.batch import batch_from_samples, load_rollouts, save_batch
from r3.rollout.engine import Engine
from r3.model.model import ModelConfig, build_model
from r3.model.moe import RoutesError
from r3.rollout.engine_formats import decode_sglang_routes, sglang_sample, vllm_sample

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]


@dataclass
class CompletionOutput:  # the fields of vllm.outputs.CompletionOutput that we read
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float | None
    logprobs: list | None
    routed_experts: np.ndarray | None = None  # [seq_len, layer_num, topk]
    finish_reason: str | None = None


@dataclass
class Logprob:
    logprob: float


def engine_rows():
    """(prompt, output, routes [n-1, L, K] int32, logp) per sequence, from our fp32 engine: the ground truth."""
    engine = Engine(build_model(CFG, 0).init_weights(0, std=0.2), "fp32")
    b = engine.generate(PROMPTS, max_new_tokens=6, eos_ids=(14,), pad_id=15, group_size=2,
                        generator=torch.Generator().manual_seed(0))
    rows = []
    for i in range(len(b)):
        v = b.attn_mask[i]
        toks = b.tokens[i][v].tolist()
        p = len(PROMPTS[i // 2])
        routes = b.routes[i][v[:-1]][:len(toks) - 1].numpy().astype(np.int32)
        rows.append((toks[:p], toks[p:], routes, b.rollout_logp[i][b.loss_mask[i]].tolist()))
    return engine, b, rows


def sglang_response(output, routes, logp, dtype=None, start=0):
    meta = {"prompt_tokens": routes.shape[0] + 1 - len(output), "completion_tokens": len(output),
            "routed_experts": base64.b64encode(routes[start:].astype(dtype or np.int32).tobytes()).decode("utf-8"),
            "output_token_logprobs": [(lp, t, None) for lp, t in zip(logp, output)]}
    if dtype is not None:
        meta["routed_experts_dtype"] = np.dtype(dtype).name
    return {"text": "", "output_ids": output, "meta_info": meta}


@pytest.mark.parametrize("source", ["sglang-int32", "sglang-uint8", "sglang-uint16", "vllm"])
def test_engine_payloads_become_the_same_batch(tmp_path, source):
    engine, b, rows = engine_rows()
    samples = []
    for i, (prompt, out, routes, logp) in enumerate(rows):
        if source == "vllm":
            c = CompletionOutput(0, "", out, None, [{t: Logprob(lp)} for t, lp in zip(out, logp)], routes)
            samples.append(vllm_sample(prompt, c, CFG, group=i // 2))
        else:
            dtype = {"sglang-int32": None, "sglang-uint8": np.uint8, "sglang-uint16": np.uint16}[source]
            samples.append(sglang_sample(prompt, sglang_response(out, routes, logp, dtype), CFG, group=i // 2))
    got = batch_from_samples(samples, CFG, pad_id=15)
    assert torch.equal(got.tokens, b.tokens) and torch.equal(got.attn_mask, b.attn_mask)
    assert torch.equal(got.response_mask, b.response_mask) and torch.equal(got.group, b.group)
    assert torch.allclose(got.rollout_logp, b.rollout_logp)
    v = b.attn_mask[:, :-1] & b.attn_mask[:, 1:]  # fed positions; a row's last token is never fed by an engine
    assert torch.equal(got.routes[v], b.routes[v])
    pad = got.routes[~v].long()  # the rest (padding, last tokens): distinct dummy ids 0..K-1, never all zeros
    assert (pad == torch.arange(CFG.num_experts_per_tok)).all()
    engine.model(got.tokens[:, :-1], valid_BT=got.attn_mask[:, :-1], routes_BTLK=got.routes)  # replays
    save_batch(got, str(tmp_path))
    back = load_rollouts(str(tmp_path), CFG)[0]
    assert torch.equal(back.routes.long(), got.routes.long().sort(-1).values)


def test_sglang_routed_experts_start_len_stitches_turns():
    _, _, rows = engine_rows()
    prompt, out, routes, logp = rows[1]
    full = prompt + out
    s1 = len(prompt) + 2  # turn 1 ended after two output tokens: its routes cover positions [0, s1 - 1)
    prev = torch.as_tensor(routes[:s1 - 1])
    resp = sglang_response(out, routes, logp, start=s1 - 1)
    resp["meta_info"]["routed_experts_start_len"] = s1 - 1
    got = sglang_sample(prompt, resp, CFG, prev_routes=prev)
    assert torch.equal(got.routes, torch.as_tensor(routes).long())
    with pytest.raises(RoutesError, match="prev_routes"):
        sglang_sample(prompt, resp, CFG)
    no_meta = sglang_response(out, routes, logp, start=3)
    r = decode_sglang_routes(no_meta["meta_info"], CFG, seq_len=len(full), prev_routes=prev, start_len=3)
    assert torch.equal(r, torch.as_tensor(routes).long())


BAD = {
    "missing": (lambda m, r: m.pop("routed_experts"), "missing"),
    "base64": (lambda m, r: m.update(routed_experts="!!not base64!!"), "base64"),
    "bytes": (lambda m, r: m.update(routed_experts=base64.b64encode(r.tobytes()[:-4]).decode()), "whole number"),
    "rows": (lambda m, r: m.update(routed_experts=base64.b64encode(r[1:].tobytes()).decode()), "rows but"),
    "zero padding": (lambda m, r: m.update(routed_experts=base64.b64encode(np.zeros_like(r).tobytes()).decode()),
                     "duplicate"),
    "range": (lambda m, r: m.update(routed_experts=base64.b64encode((r + 8).tobytes()).decode()), "out of range"),
    "minus one": (lambda m, r: m.update(routed_experts=base64.b64encode((r * 0 - 1).tobytes()).decode()),
                  "missing"),
    "dtype": (lambda m, r: m.update(routed_experts_dtype="float16"), "routed_experts_dtype"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sglang_payloads_are_refused(case):
    _, _, rows = engine_rows()
    prompt, out, routes, logp = rows[0]
    resp = sglang_response(out, routes, logp)
    corrupt, words = BAD[case]
    corrupt(resp["meta_info"], routes)
    with pytest.raises(RoutesError, match=words):
        sglang_sample(prompt, resp, CFG)


def test_bad_vllm_outputs_and_wrong_model_are_refused():
    _, _, rows = engine_rows()
    prompt, out, routes, _ = rows[0]
    with pytest.raises(RoutesError, match="enable_return_routed_experts"):
        vllm_sample(prompt, CompletionOutput(0, "", out, None, None, None), CFG)
    with pytest.raises(RoutesError, match="integer"):
        vllm_sample(prompt, CompletionOutput(0, "", out, None, None, routes.astype(np.float32)), CFG)
    with pytest.raises(RoutesError, match="3 layers"):
        vllm_sample(prompt, CompletionOutput(0, "", out, None, None, routes), CFG.__class__(
            **{**CFG.__dict__, "num_hidden_layers": 3}))
    with pytest.raises(RoutesError, match="need"):  # the final token's route is never returned: n - 1 rows
        vllm_sample(prompt, CompletionOutput(0, "", out, None, None, np.concatenate([routes, routes[-1:]])), CFG)
