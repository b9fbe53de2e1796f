"""What this proves: the engine-import library (`r3.rollout.engine_formats`, `r3.rollout.batch.batch_from_samples`)
refuses, where the data enters and naming the field, row and position, everything a saved rollout folder would refuse:
NaN or positive log-probs, log-prob entries for other tokens than output_ids, token ids outside the vocabulary, NaN
rewards, a None response, a None vLLM log-prob entry (one line naming its position), prev-routes of the wrong layer
count, a meta.temperature string; a list where a tensor belongs is either taken as the same ids or refused by name;
samples without routes make a batch without routes, but not mixed with samples that have them; and the in-memory and
on-disk checks give the same message."""
import base64
import math
import sys

import numpy as np
import pytest
import torch

from r3.rollout.batch import batch_from_samples, load_rollouts, save_batch
from r3.rollout.engine_formats import EngineSample, decode_sglang_routes, sglang_sample, vllm_sample
from r3.errors import InputError, run_main
from r3.model.model import ModelConfig
from r3.model.moe import RoutesError
from r3.runs.validate import check_batch_fields, check_batch_model

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)
PROMPT, OUT = [1, 2, 3], [4, 5, 14]


def routes(n: int) -> np.ndarray:
    """[n, L, K] int32: distinct ids per (position, layer), a valid top-2 set everywhere."""
    r = np.stack([np.arange(n) % 8, (np.arange(n) + 1) % 8], -1)  # [n, K]
    return np.repeat(r[:, None], CFG.num_hidden_layers, 1).astype(np.int32)


def response(out=OUT, logp=(-0.5, -1.0, -0.1), ids=None):
    r = routes(len(PROMPT) + len(out) - 1)
    lp = [(v, t, None) for v, t in zip(logp, ids or out)]
    return {"output_ids": list(out), "meta_info": {"routed_experts": base64.b64encode(r.tobytes()).decode(),
                                                   "output_token_logprobs": lp}}


def sample(**kw) -> EngineSample:
    s = dict(prompt_ids=PROMPT, output_ids=OUT, routes=torch.as_tensor(routes(5)), output_logp=[-0.5, -1.0, -0.1],
             reward=1.0, group=0)
    return EngineSample(**{**s, **kw})


@pytest.mark.parametrize("logp, words", [((-0.5, math.nan, -0.1), r"logprob\[1\] is nan"),
                                         ((-0.5, 0.7, -0.1), r"logprob\[1\] is 0.7: not a log-probability"),
                                         ((-0.5, "x", -0.1), r"logprob\[1\] is 'x'")])
def test_sglang_log_probs_must_be_log_probs(logp, words):
    with pytest.raises(InputError, match=words):
        sglang_sample(PROMPT, response(logp=logp), CFG)


def test_sglang_log_prob_ids_must_be_the_output_ids():
    with pytest.raises(InputError, match=r"output_token_logprobs\[2\] is for token 9 but output_ids\[2\] is 14"):
        sglang_sample(PROMPT, response(ids=[4, 5, 9]), CFG)


@pytest.mark.parametrize("resp, words", [(None, "SGLang response is NoneType"), ([], "SGLang response is list"),
                                         ({"output_ids": None}, "neither output_ids"),
                                         ({"output_ids": [4, None]}, r"output_ids\[1\] is None"),
                                         ({"meta_info": "x"}, "meta_info is str")])
def test_sglang_responses_that_are_not_responses(resp, words):
    with pytest.raises(InputError, match=words):
        sglang_sample(PROMPT, resp, CFG)


def test_vllm_none_completion_and_bad_log_probs():
    with pytest.raises(InputError, match="vLLM completion is NoneType"):
        vllm_sample(PROMPT, None, CFG)

    class Completion:
        token_ids, routed_experts = OUT, routes(5)
        logprobs = [{4: -0.5}, {5: float("inf")}, {14: -0.1}]
    with pytest.raises(InputError, match=r"logprobs \(sampled token\)\[1\] is inf"):
        vllm_sample(PROMPT, Completion(), CFG)


def test_a_vllm_log_prob_entry_that_is_none_is_one_line_naming_the_position(monkeypatch, capsys):
    class Completion:
        token_ids, routed_experts = OUT, routes(5)
        logprobs = [{4: -0.5}, None, {14: -0.1}]  # an engine that returned no log-probs for the second token
    monkeypatch.setattr(sys, "argv", ["prog"])
    with pytest.raises(SystemExit) as e:
        run_main(lambda: vllm_sample(PROMPT, Completion(), CFG))  # as every entry point reports it
    assert e.value.code == 1 and capsys.readouterr().err == (
        "error: vLLM CompletionOutput.logprobs[1] is None, not a {token_id: Logprob} dict for output token 1 (id 5); "
        "request logprobs for every sampled token\n")


def test_prev_routes_of_the_wrong_layer_count_are_refused_by_name():
    full = routes(5)
    meta = {"routed_experts": base64.b64encode(full[2:].tobytes()).decode(), "routed_experts_start_len": 2}
    prev = torch.as_tensor(np.concatenate([full[:2]] * 2, 1))  # [2, 4 layers, 2]
    with pytest.raises(RoutesError, match=r"prev_routes has shape \[2, 4, 2\].*need \[>= 2, 2, 2\]"):
        decode_sglang_routes(meta, CFG, seq_len=6, prev_routes=prev)
    with pytest.raises(RoutesError, match="prev_routes: expert ids must be integers"):
        decode_sglang_routes(meta, CFG, seq_len=6, prev_routes=full[:2].astype(np.float32))
    got = decode_sglang_routes(meta, CFG, seq_len=6, prev_routes=full[:2].tolist())  # a list of ids is ids
    assert torch.equal(got, torch.as_tensor(full).long())


def test_routes_given_as_a_list_are_the_same_ids_and_other_types_are_named():
    as_list = batch_from_samples([sample(routes=routes(5).tolist())], CFG, pad_id=15)
    as_tensor = batch_from_samples([sample()], CFG, pad_id=15)
    assert torch.equal(as_list.routes, as_tensor.routes)
    # None: the engine sent no routes (a server without --enable-return-routed-experts): a batch without routes, which
    # R3 refuses (check_batch_model), unless only some samples lack them
    assert batch_from_samples([sample(routes=None)] * 2, CFG, pad_id=15).routes is None
    with pytest.raises(InputError, match="sample 1 has no routes but others have: 1 of 2 without"):
        batch_from_samples([sample(), sample(routes=None)], CFG, pad_id=15)
    with pytest.raises(RoutesError, match="sample 0: routes: a str"):
        batch_from_samples([sample(routes="0,1")], CFG, pad_id=15)


@pytest.mark.parametrize("bad, words", [
    (dict(output_logp=[-0.5, math.nan, -0.1]), r"'rollout_logp' row 1 is non-finite on the response \(position 3\)"),
    (dict(output_logp=[-0.5, 0.3, -0.1]), r"field 'rollout_logp' row 1 position 3 is 0.3 > 0"),
    (dict(output_ids=[4, 99, 14]), r"field 'tokens' row 1 position 4: token id 99 is outside the vocabulary"),
    (dict(reward=math.nan), r"field 'rewards' row 1 is nan"),
    (dict(reward=None), r"sample 1: reward is None"),
    (dict(output_ids=None), r"sample 1: output_ids is None"),
    (dict(output_logp=[-0.5, None, -0.1]), r"sample 1: output_logp\[1\] is None"),
    (dict(group="a"), r"sample 1: group is 'a'"),
])
def test_batch_from_samples_names_field_row_and_position(bad, words):
    with pytest.raises(InputError, match=words):
        batch_from_samples([sample(), sample(**bad)], CFG, pad_id=15)


def test_meta_temperature_must_be_a_number():
    with pytest.raises(InputError, match="meta.temperature is 'hot'"):
        batch_from_samples([sample()], CFG, pad_id=15, meta=dict(temperature="hot"))
    with pytest.raises(InputError, match="meta is list"):
        batch_from_samples([sample()], CFG, pad_id=15, meta=[1])
    with pytest.raises(InputError, match="non-empty list of EngineSample"):
        batch_from_samples([], CFG, pad_id=15)


@pytest.mark.parametrize("corrupt, words", [
    (lambda b: b.rollout_logp.__setitem__((1, 3), math.nan), r"field 'rollout_logp' row 1 is non-finite"),
    (lambda b: b.rollout_logp.__setitem__((1, 3), 0.5), r"field 'rollout_logp' row 1 position 3 is 0.5 > 0"),
    (lambda b: b.rewards.__setitem__(1, math.nan), r"field 'rewards' row 1 is nan"),
    (lambda b: b.tokens.__setitem__((1, 4), 99), r"field 'tokens' row 1 position 4: token id 99"),
    (lambda b: b.meta.__setitem__("temperature", "hot"), "meta.temperature is 'hot'"),
])
def test_the_same_check_refuses_a_batch_in_memory_and_its_saved_folder(tmp_path, corrupt, words):
    b = batch_from_samples([sample(), sample(group=1)], CFG, pad_id=15)
    corrupt(b)
    with pytest.raises(InputError, match=words) as in_memory:
        check_batch_fields(b, "batch")
        check_batch_model(b, CFG, "batch", require_routes=True)
    save_batch(b, str(tmp_path / "b"))  # save_batch writes what it is given; the loader is the boundary
    with pytest.raises(InputError, match=words) as on_disk:
        load_rollouts(str(tmp_path / "b"), CFG)
    assert str(on_disk.value).split(": ", 1)[1] == str(in_memory.value).split(": ", 1)[1]
