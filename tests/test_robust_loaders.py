"""What this proves: every loader error names the file and, where it can, the field or line (issue 10, class 11):
corrupt config / index / generation_config / tokenizer JSON, top_k > num_experts (at load, not at a forward),
non-UTF-8 or mistyped jsonl lines and prompts too long for the model, a checkpoint missing its RNG or guard state or
written for another model, a non-finite model that would overwrite a good checkpoint, a truncated warm-up cache
(named and rebuilt), SGLang's start_len of the wrong type and a vLLM logprobs entry without the sampled token."""
import dataclasses
import json
import os
from types import SimpleNamespace

import pytest
import torch

from r3.runs.checkpoint import load_checkpoint, save_checkpoint
from r3.scale.hf import CheckpointError, config_to_hf, load_config, load_tokenizer, shard_files
from r3.tasks.jsonl_task import JsonlTask, make_jsonl_task
from r3.model.model import ModelConfig, build_model
from r3.model.moe import RoutesError
from r3.rollout.engine_formats import decode_sglang_routes, vllm_sample
from r3.tasks.tasks import make_task
from r3.train.warmup import checkpoint_config, save_weights, warmed_up_model

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant", "\n", "a", "b", "[UNK]"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("\n", "isolated")
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    return d


def corrupt(path, text='{"a": 1,\n "b": }'):
    with open(path, "w") as f:
        f.write(text)


def test_corrupt_hf_json_files_are_named_with_line_and_column(tmp_path, tok_dir):
    corrupt(tmp_path / "config.json")
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON \(line 2, column 7"):
        load_config(str(tmp_path))
    open(tmp_path / "config.json", "wb").write(b'{"vocab_size": "\xff"}')
    with pytest.raises(CheckpointError, match="config.json: not UTF-8"):
        load_config(str(tmp_path))
    corrupt(tmp_path / "model.safetensors.index.json")
    with pytest.raises(CheckpointError, match="model.safetensors.index.json: not valid JSON"):
        shard_files(str(tmp_path))
    corrupt(tmp_path / "model.safetensors.index.json", '{"weight_map": {"w": 3}}')
    with pytest.raises(CheckpointError, match=r"index.json: weight_map\['w'\] is 3"):
        shard_files(str(tmp_path))
    gen = tok_dir / "generation_config.json"
    try:
        corrupt(gen)
        with pytest.raises(CheckpointError, match="generation_config.json: not valid JSON"):
            load_tokenizer(str(tok_dir))
        corrupt(gen, '{"eos_token_id": "2"}')
        with pytest.raises(CheckpointError, match="generation_config.json: eos_token_id='2'"):
            load_tokenizer(str(tok_dir))
    finally:
        os.remove(gen)
    assert load_tokenizer(str(tok_dir)).eos_ids
    corrupt(tmp_path / "tokenizer.json")
    with pytest.raises(CheckpointError, match="tokenizer.json: cannot be read as a tokenizer"):
        load_tokenizer(str(tmp_path))


@pytest.mark.parametrize("change, words", [
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9 > num_experts=8"),
    (dict(num_experts="8"), "num_experts='8' must be a positive integer"),
    (dict(hidden_size=0), "hidden_size=0 must be a positive integer"),
    (dict(head_dim=7), "head_dim=7 must be even"),
    (dict(rope_theta="1e4"), "rope_theta='1e4' must be a number"),
])
def test_a_config_no_forward_could_run_is_refused_at_load(tmp_path, change, words):
    json.dump({**config_to_hf(CFG, torch.float32), **change}, open(tmp_path / "config.json", "w"))
    with pytest.raises(CheckpointError, match=f"config.json: {words}"):
        load_config(str(tmp_path))
    path = str(tmp_path / "w.safetensors")  # the same check on a save_weights checkpoint's metadata
    save_weights(build_model(CFG, 0), path, dict(cfg=dict(dataclasses.asdict(CFG), num_experts_per_tok=9)))
    with pytest.raises(ValueError, match="w.safetensors .metadata cfg.: num_experts_per_tok=9"):
        checkpoint_config(path)


def test_jsonl_lines_are_named(tmp_path, tok_dir):
    tok = load_tokenizer(str(tok_dir))
    f = tmp_path / "q.jsonl"
    f.write_bytes(b'{"prompt": "a", "answer": 1}\n{"prompt": "b\xff", "answer": 2}\n')
    with pytest.raises(ValueError, match=r"q.jsonl:2: not UTF-8"):
        make_jsonl_task(f"jsonl:{f}", tok)
    f.write_text('{"prompt": "a", "answer": 1}\n\n{"prompt": "b", "answer": [2]}\n')
    with pytest.raises(ValueError, match=r"q.jsonl:3: field 'answer' must be a string or number, got list"):
        make_jsonl_task(f"jsonl:{f}", tok)
    long = json.dumps(dict(prompt="\n".join(["a"] * 20), answer=2))  # 39 tokens where "a" is 1
    f.write_text('{"prompt": "a", "answer": 1}\n\n' + long + "\n")
    task = JsonlTask(str(f), tok, max_new_tokens=4)
    short = len(task.example(0).prompt)
    assert task.check_lengths(100) == short + 38
    with pytest.raises(ValueError, match=r"q.jsonl:3: the prompt is \d+ tokens; with 4 new tokens"):
        task.check_lengths(short + 4)


class _Engine:
    def __init__(self, model):
        self.model = model


def _state(seed):
    model = build_model(CFG, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, _Engine(build_model(CFG, seed)), dict(data=torch.Generator().manual_seed(seed))


def test_a_checkpoint_missing_rng_or_guard_state_or_for_another_model_is_refused(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    model, opt, engine, gens = _state(0)
    save_checkpoint(path, model=model, optimizer=opt, engine=engine, generators=gens, step=3, extra=dict(guard={}))
    good = torch.load(path, weights_only=True)
    for drop, words in ((lambda s: s["rng"].pop("data"), r"no RNG state rng\['data'\]"),
                        (lambda s: s["extra"].pop("guard"), r"no extra\['guard'\]"),
                        (lambda s: s.pop("optimizer"), "has no 'optimizer'")):
        bad = torch.load(path, weights_only=True)
        drop(bad)
        torch.save(bad, str(tmp_path / "bad.pt"))
        m2, o2, e2, g2 = _state(1)
        before = m2.state_dict()["lm_head.weight"].clone()
        with pytest.raises(RuntimeError, match=f"bad.pt.*{words}"):
            load_checkpoint(str(tmp_path / "bad.pt"), model=m2, optimizer=o2, engine=e2, generators=g2)
        assert torch.equal(m2.state_dict()["lm_head.weight"], before)  # refused before anything was restored
    other = build_model(dataclasses.replace(CFG, num_experts=4), 0)
    with pytest.raises(RuntimeError, match="written for another model"):
        load_checkpoint(path, model=other, optimizer=opt, engine=engine, generators=gens)
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="refusing to save .*lm_head.weight"):
        save_checkpoint(path, model=model, optimizer=opt, engine=engine, generators=gens, step=4, extra={})
    assert torch.equal(torch.load(path, weights_only=True)["model"]["lm_head.weight"], good["model"]["lm_head.weight"])


def test_a_truncated_warmup_cache_is_named_and_rebuilt(tmp_path, capsys):
    task = make_task("sort:2-3")
    kw = dict(steps=1, seed=0, batch_size=4, cache_dir=str(tmp_path), progress=False)
    model, path = warmed_up_model(CFG, task, "sort:2-3", **kw)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    again, path2 = warmed_up_model(CFG, task, "sort:2-3", **kw)
    assert path2 == path and f"warm-up cache {path} is unreadable" in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert open(path, "rb").read() == data


def test_engine_payload_fields_of_the_wrong_type_are_named():
    meta = dict(routed_experts="", routed_experts_start_len="3")
    with pytest.raises(RoutesError, match="routed_experts_start_len='3' .str. must be an integer"):
        decode_sglang_routes(meta, CFG, seq_len=4)
    routes = torch.arange(2).expand(4, 2, 2).numpy()  # [prompt 3 + output 2 - 1, L, K]
    c = SimpleNamespace(token_ids=[5, 6], routed_experts=routes, logprobs=[{5: -0.1}, {7: -0.2}])
    with pytest.raises(ValueError, match=r"logprobs\[1\] has no entry for the sampled token 6"):
        vllm_sample([1, 2, 3], c, CFG)
    c.logprobs = [{5: -0.1}]
    with pytest.raises(ValueError, match="1 entries for 2 output tokens"):
        vllm_sample([1, 2, 3], c, CFG)
