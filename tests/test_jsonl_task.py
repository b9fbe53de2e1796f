"""What this proves: the jsonl task reads and validates its file, formats prompts with the ChatML template of the
checkpoint tokenizer, extracts the last \\boxed{...} (nested braces) and rewards exact matches only; and the
tokenizer loader reads EOS/pad ids from the checkpoint's files, falling back to Qwen3's."""
import json

import pytest
import torch

from r3.scale.hf import QWEN_EOS_IDS, load_tokenizer
from r3.tasks.jsonl_task import boxed_reward, last_boxed, make_jsonl_task

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A tiny byte-level BPE tokenizer with Qwen's special tokens and config files naming them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["What is 2+3? The answer is \\boxed{5}.", "user assistant \\frac{1}{2}"], trainer)
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIAL}
    (d / "tokenizer_config.json").write_text(json.dumps(dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")))
    (d / "generation_config.json").write_text(json.dumps(dict(eos_token_id=[ids["<|im_end|>"],
                                                                            ids["<|endoftext|>"]])))
    return d, ids


def test_tokenizer_reads_eos_and_pad_and_applies_chatml(tok_dir):
    d, ids = tok_dir
    tok = load_tokenizer(str(d))
    assert tok.eos_ids == (ids["<|im_end|>"], ids["<|endoftext|>"]) and tok.pad_id == ids["<|endoftext|>"]
    chat = tok.encode_chat("What is 2+3?")
    assert chat[0] == ids["<|im_start|>"] and ids["<|im_end|>"] in chat
    assert tok.decode(chat, skip_special_tokens=False) == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n" \
                                                          "<|im_start|>assistant\n"
    (d / "tokenizer_config.json").rename(d / "tc.json")
    (d / "generation_config.json").rename(d / "gc.json")
    try:
        assert load_tokenizer(str(d)).eos_ids == QWEN_EOS_IDS  # no files name an EOS: Qwen3's ids
    finally:
        (d / "tc.json").rename(d / "tokenizer_config.json")
        (d / "gc.json").rename(d / "generation_config.json")


@pytest.mark.parametrize("text, want", [
    ("so \\boxed{5}", "5"),
    ("\\boxed{1} then \\boxed{2}", "2"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{{a}{b{c}}} tail", "{a}{b{c}}"),
    ("$\\boxed 42$", "42"),
    ("no box here", None),
    ("\\boxed{1} and \\boxed{unclosed", None),
    ("\\boxed", None),
])
def test_last_boxed(text, want):
    assert last_boxed(text) == want


def test_boxed_reward_strips_spaces_and_needs_exact_match():
    assert boxed_reward("x = \\boxed{ 1 / 2 }", "1/2") == (1.0, dict(exact=True, has_boxed=True, extracted=" 1 / 2 "))
    assert boxed_reward("\\boxed{12}", "1 2")[0] == 1.0
    assert boxed_reward("\\boxed{0.5}", "1/2")[0] == 0.0
    assert boxed_reward("the answer is 5", "5") == (0.0, dict(exact=False, has_boxed=False, extracted=None))
    assert boxed_reward("\\boxed{7}", "so \\boxed{7}")[0] == 1.0  # a boxed reference compares its content


def test_jsonl_task_samples_and_rewards(tok_dir, tmp_path):
    d, ids = tok_dir
    tok = load_tokenizer(str(d))
    f = tmp_path / "qa.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [dict(question="What is 2+3?", solution=5),
                                                    dict(question="What is 1/2?", solution="\\frac{1}{2}")]) + "\n\n")
    task = make_jsonl_task(f"jsonl:{f}:question:solution", tok, max_new_tokens=64)
    assert len(task) == 2 and task.max_new_tokens == 64 and task.name == "jsonl"
    exs = task.sample(6, torch.Generator().manual_seed(0))
    assert exs == task.sample(6, torch.Generator().manual_seed(0))  # the generator fixes the draw
    ex = next(e for e in exs if e.answer == "5")
    assert ex.prompt == tok.encode_chat("What is 2+3?")
    right = tok.encode("The answer is \\boxed{5}.") + [ids["<|im_end|>"]]
    wrong = tok.encode("The answer is \\boxed{2}.") + [ids["<|im_end|>"]]
    assert task.reward(right, ex) == (1.0, dict(exact=True, has_boxed=True, extracted="5"))
    assert task.reward(wrong, ex)[0] == 0.0


@pytest.mark.parametrize("line, words", [
    ("{not json", "qa.jsonl:1: not valid JSON"),
    ('{"prompt": "q"}', "qa.jsonl:1: missing field 'answer'"),
    ('{"prompt": 3, "answer": "a"}', "field 'prompt' must be a string"),
    ('["prompt", "answer"]', "expected a JSON object"),
])
def test_bad_jsonl_lines_are_named(line, words, tok_dir, tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(ValueError, match=words):
        make_jsonl_task(f"jsonl:{f}", load_tokenizer(str(tok_dir[0])))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_jsonl_task(f"jsonl:{tmp_path}/nope.jsonl", load_tokenizer(str(tok_dir[0])))
