"""What this proves: the cipher task is what its docstring says (one fixed permutation of 64 symbols applied position
by position, ids inside its 80-token vocabulary, EOS/PAD shared with the 16-token tasks), a preset meets it with a
widened vocabulary while the 16-token tasks keep the preset exactly (so their cached warm-ups and runs are
untouched), train.py runs on it end to end, and --is-correction with the engine's π_old is refused, since its weight
is identically 1 there."""
import os
import subprocess
import sys

import pytest
import torch

from r3.train.config import TrainConfig, parse
from r3.model.model import PRESETS
from r3.tasks.tasks import BASE_VOCAB, EOS, PAD, SYMBOL0, SYMBOLS, VOCAB, Cipher, decode, make_task
from r3.train.warmup import preset_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cipher_maps_every_symbol_through_one_permutation():
    task = make_task("cipher")
    assert (task.min_len, task.max_len) == (32, 32) and task.max_new_tokens == 33
    assert sorted(Cipher.PI) == list(range(SYMBOLS)) and Cipher.PI != list(range(SYMBOLS))
    first = SYMBOL0
    for ex in task.sample(50, torch.Generator().manual_seed(0), split="train"):
        assert ex.prompt[-1] == VOCAB.index("=") and len(ex.answer) == len(ex.prompt) - 1 == 32
        assert all(first <= t < task.vocab_size for t in ex.prompt[:-1] + ex.answer)
        assert ex.answer == [first + Cipher.PI[t - first] for t in ex.prompt[:-1]]
        assert task.reward(ex.answer + [EOS], ex) == (1.0, dict(exact=True))
        wrong = ex.answer[:-1] + [first + (ex.answer[-1] - first + 1) % SYMBOLS, EOS]  # last symbol off by one
        r, info = task.reward(wrong, ex)
        assert r < 1 and not info["exact"]
    assert task.vocab_size == len(VOCAB) == 80 and max(EOS, PAD) < len(BASE_VOCAB)
    assert decode([first, first + 63]) == "s0 s63"


def test_cipher_lengths_and_split():
    task = make_task("cipher:8-12")
    lens = {len(e.answer) for e in task.sample(200, torch.Generator().manual_seed(1))}
    assert lens <= set(range(8, 13)) and len(lens) > 1
    held = make_task("cipher").sample(20, torch.Generator().manual_seed(2), split="eval")
    assert all(task.split_of(e) == "eval" for e in held)


def test_presets_widen_their_vocabulary_only_for_a_wider_task():
    assert preset_config("toy", make_task("sort")) == PRESETS["toy"]  # the 16-token tasks: the preset as it was
    cfg = preset_config("qwen3-ratio", make_task("cipher"))
    assert cfg.vocab_size == 80 and cfg.num_experts == PRESETS["qwen3-ratio"].num_experts
    assert preset_config("toy", make_task("cipher"), dense=True).dense
    with pytest.raises(SystemExit, match="unknown preset"):
        preset_config("huge")


def test_train_runs_on_the_cipher_task(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--task", "cipher:4-6", "--steps", "2",
                        "--prompts-per-step", "2", "--group-size", "2", "--warmup-steps", "2", "--r3",
                        "--eval-every", "1", "--eval-prompts", "4", "--no-plot", "--quiet", "--out", "run"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    from r3.runs.io import read_jsonl
    rows = read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
    assert [m["step"] for m in rows] == [0, 1] and all(0 <= m["reward"] <= 1 for m in rows)


@pytest.mark.parametrize("kind", ["tis", "icepop", "mis"])
def test_an_importance_correction_against_the_engines_own_logp_is_refused(kind, capsys):
    with pytest.raises(SystemExit):
        parse(TrainConfig, ["--is-correction", kind, "--old-logp", "engine"])
    assert "--old-logp trainer" in capsys.readouterr().err
    assert parse(TrainConfig, ["--is-correction", kind]).old_logp == "trainer"
