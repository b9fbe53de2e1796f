"""What this proves: experiments.staleness.starts credits each cipher symbol with the teacher-forced probability of its
own image (a model sure of one symbol's image and unsure of the rest is read as exactly that), and end to end it scores
a warm-up checkpoint from train.py's cache, sets it beside a grid's start, climb and stuck symbols (their probability
and rank among the 64), names a damaged grid file in one line, and refuses a warm-up of no steps."""
import json

import pytest
import torch

from experiments.staleness import starts as S
from r3.errors import InputError
from r3.tasks.tasks import SYMBOL0, VOCAB, Cipher, make_task


class Stub:
    """Logits 0 everywhere except +20 on the image of `sure` wherever the next answer token is that image."""
    def __init__(self, sure: int, P: int):
        self.sure, self.P = sure, P

    def __call__(self, tokens):
        B, T = tokens.shape
        logits = torch.zeros(B, T, len(VOCAB))
        for b in range(B):
            for t in range(self.P - 1, T):
                src = int(tokens[b, t - self.P + 1]) - SYMBOL0  # answer position t - P + 1 maps prompt symbol there
                if src == self.sure:
                    logits[b, t, SYMBOL0 + Cipher.PI[src]] = 20.0
        return logits, None


def test_each_symbol_is_credited_with_its_own_image():
    task = make_task("cipher:8-8")
    examples = task.sample(64, torch.Generator().manual_seed(0), split="eval")
    P = len(examples[0].prompt)
    sure = examples[0].prompt[0] - SYMBOL0
    p = S.per_symbol(Stub(sure, P), examples)
    assert p[sure] == pytest.approx(1.0, abs=1e-6)
    uniform = 1 / len(VOCAB)
    assert all(v == pytest.approx(uniform, rel=1e-5) for s, v in p.items() if s != sure)
    seen = {t - SYMBOL0 for e in examples for t in e.prompt[:-1]}
    assert set(p) == seen  # a symbol never in the answers has no entry, not a made-up one


def test_end_to_end_beside_a_grid(tmp_path):
    grid = tmp_path / "grid"
    grid.mkdir()
    (grid / "grid.json").write_text(json.dumps(dict(start=dict(seeds=[
        dict(seed=0, start=0.4, best_n4_n8=0.9, n4_n8_runs=10)]))))
    (grid / "plateaus.json").write_text(json.dumps(dict(runs=[
        dict(run="fp32-none-n4-lr0.0003-s0", stuck=[5, 9]), dict(run="fp32-r2-n4-lr0.0003-s0", stuck=[5]),
        dict(run="fp32-none-n4-lr0.0003-s1", stuck=[7])])))
    out = tmp_path / "out"
    S.main(["--seeds", "0", "--warmup-steps", "2", "--grid", str(grid), "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out)])
    d = json.loads((out / "starts.json").read_text())
    (row,) = d["rows"]
    assert row["seed"] == 0 and row["warmup_steps"] == 2 and 0 <= row["sampled_reward"] <= 1
    assert len(row["symbol_p"]) == 64 and sorted(row["rank"].values()) == list(range(1, 65))
    by_rank = sorted(row["symbol_p"], key=lambda s: row["rank"][s])  # rank 1 is the least sure
    assert all(row["symbol_p"][a] <= row["symbol_p"][b] for a, b in zip(by_rank, by_rank[1:]))
    assert all((row["symbol_p"][str(s)] < S.WEAK) for s in row["weak"])
    assert len(row["weak"]) == sum(v < S.WEAK for v in row["symbol_p"].values())
    assert row["mean_symbol_p"] == pytest.approx(sum(row["symbol_p"].values()) / 64)
    assert d["grid"]["0"]["stuck"] == {"5": ["fp32-none-n4-lr0.0003-s0", "fp32-r2-n4-lr0.0003-s0"],
                                       "9": ["fp32-none-n4-lr0.0003-s0"]}
    md = (out / "starts.md").read_text()
    five = f"5: {S.fmt(row['symbol_p']['5'])} ({row['rank']['5']}, 2)"
    assert f"| 0 | {S.fmt(row['sampled_reward'])} | {S.fmt(row['greedy_exact'])} | 0.4 | 0.9 (10) | {five}" in md
    assert (out / "starts.png").stat().st_size > 0
    assert any(p.suffix == ".safetensors" for p in (tmp_path / "cache").iterdir())  # train.py's cache, reused


def test_a_damaged_grid_file_is_one_clear_error(tmp_path):
    (tmp_path / "grid.json").write_text("{not json")
    with pytest.raises(InputError, match=r"grid\.json: not valid JSON"):
        S.grid_view(str(tmp_path))
    (tmp_path / "grid.json").write_text(json.dumps(dict(start=dict(seeds=[dict(seed=0)]))))
    with pytest.raises(InputError, match=r"grid\.json: not an experiments\.staleness grid\.json"):
        S.grid_view(str(tmp_path))
    (tmp_path / "grid.json").write_text(json.dumps(dict(cells={})))  # before the start rule: nothing beside
    (tmp_path / "plateaus.json").write_text(json.dumps(dict(runs=[dict(run="no-seed-here")])))
    with pytest.raises(InputError, match=r"plateaus\.json: not an experiments\.staleness\.plateaus result"):
        S.grid_view(str(tmp_path))
    (tmp_path / "plateaus.json").unlink()
    assert S.grid_view(str(tmp_path)) == {}


def test_refuses_a_warmup_of_no_steps_and_a_grid_folder_that_is_not_there(tmp_path):
    for bad in (["--warmup-steps", "0"], ["--grid", str(tmp_path / "typo")]):
        with pytest.raises(SystemExit) as e:
            S.parse_args(bad)
        assert e.value.code == 2
