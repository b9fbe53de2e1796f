"""What this proves: the held-out set never overlaps the prompts training draws (toy tasks and jsonl files, one file
split by hash or a separate eval file), `split=None` keeps the old sampling stream bit for bit, greedy decoding is the
argmax, and `evaluate` reports greedy and sampled exact-match accuracy as `reward_batch` scores them."""
import json

import pytest
import torch

from r3.rollout.batch import Batch
from r3.rollout.engine import Engine
from r3.train.evaluate import evaluate, heldout_examples
from r3.tasks.jsonl_task import JsonlTask
from r3.model.model import ModelConfig, build_model
from r3.tasks.tasks import EOS, PAD, make_task, prompt_split

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)


@pytest.mark.parametrize("spec", ["sort:2-3", "reverse", "add:1-2"])
def test_heldout_never_overlaps_training(spec):
    task = make_task(spec)
    held = heldout_examples(task, 40, seed=3)
    assert len(held) == 40 and len({tuple(e.prompt) for e in held}) == 40
    assert all(prompt_split(e.prompt) == "eval" for e in held)
    assert [e.prompt for e in heldout_examples(task, 40, seed=3)] == [e.prompt for e in held]  # fixed
    seen = set()
    for seed in range(3):
        seen |= {tuple(e.prompt) for e in task.sample(3000, torch.Generator().manual_seed(seed), split="train")}
    assert not seen & {tuple(e.prompt) for e in held}
    evals = task.sample(3000, torch.Generator().manual_seed(0), split=None)
    assert 0.03 < sum(prompt_split(e.prompt) == "eval" for e in evals) / 3000 < 0.1  # about 1 in 16


def test_no_split_keeps_the_old_stream():
    task = make_task("sort")
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert task.sample(50, g1) == [task.example(g2) for _ in range(50)]
    with pytest.raises(ValueError, match="split"):
        task.sample(1, g1, split="test")
    tiny = make_task("sort:1-1")  # 10 prompts in all
    n_eval = sum(prompt_split(tiny.example(torch.Generator().manual_seed(d)).prompt) == "eval" for d in range(200))
    held = heldout_examples(tiny, 50)
    assert len(held) == len({tuple(e.prompt) for e in held}) <= 10 and (len(held) > 0) == (n_eval > 0)
    tiny.split_of = lambda ex: "train"  # a task without eval prompts fails loudly instead of looping
    with pytest.raises(ValueError, match="too few 'eval'"):
        tiny.sample(1, g1, split="eval")


class CharTokenizer:
    def encode_chat(self, q):
        return [ord(c) % 16 for c in q]


def write_rows(path, questions):
    path.write_text("".join(json.dumps(dict(prompt=q, answer="1")) + "\n" for q in questions))
    return str(path)


def test_jsonl_heldout_by_hash_and_by_file(tmp_path):
    task = JsonlTask(write_rows(tmp_path / "train.jsonl", [f"question {i}" for i in range(400)]), CharTokenizer())
    held = heldout_examples(task, 1000, seed=0)
    assert 0 < len(held) == len(task.split_rows("eval")) < 60
    assert all(prompt_split(e.question) == "eval" for e in held)
    drawn = {e.question for e in task.sample(5000, torch.Generator().manual_seed(0), split="train")}
    assert not drawn & {e.question for e in held} and len(drawn) == len(task.split_rows("train"))
    other = JsonlTask(write_rows(tmp_path / "eval.jsonl", ["question 3", "new a", "question 7", "new b"]),
                      CharTokenizer())
    assert sorted(e.question for e in heldout_examples(task, 10, eval_task=other)) == ["new a", "new b"]


def test_greedy_is_the_argmax():
    model = build_model(CFG, 0).float().eval()
    prompts = [e.prompt for e in make_task("sort:3-4").sample(4, torch.Generator().manual_seed(0))]
    eng = Engine(model, "fp32")
    kw = dict(max_new_tokens=5, eos_ids=(EOS,), pad_id=PAD, temperature=0.0)
    a = eng.generate(prompts, generator=torch.Generator().manual_seed(1), **kw)
    b = eng.generate(prompts, generator=torch.Generator().manual_seed(2), **kw)
    assert torch.equal(a.tokens, b.tokens)
    with torch.no_grad():
        logp = model(a.tokens[:, :-1], valid_BT=a.attn_mask[:, :-1])[0].log_softmax(-1)
    m = a.loss_mask
    assert torch.equal(logp.argmax(-1)[m], a.tokens[:, 1:][m])
    assert torch.allclose(logp.max(-1).values[m], a.rollout_logp[m], atol=1e-5, rtol=0)


class Oracle(Engine):
    """Answers right when greedy, with the first answer digit wrong when sampling."""

    def __init__(self, examples):
        self.examples, self.model = examples, torch.nn.Linear(1, 1)

    def generate(self, prompts, *, max_new_tokens, eos_ids, pad_id, group_size=1, temperature=1.0, **_):
        answers = {tuple(e.prompt): e.answer for e in self.examples}
        rows = [(p, answers[tuple(p)] + [EOS]) for p in prompts for _ in range(group_size)]
        if temperature > 0:
            rows = [(p, [(a[0] + 1) % 10] + a[1:]) for p, a in rows]
        Lp, N = max(len(p) for p, _ in rows), max(len(a) for _, a in rows)
        tokens, attn = torch.full((len(rows), Lp + N), PAD), torch.zeros(len(rows), Lp + N, dtype=torch.bool)
        resp = torch.zeros_like(attn)
        for i, (p, a) in enumerate(rows):
            tokens[i, Lp - len(p):Lp + len(a)] = torch.tensor(p + a)
            attn[i, Lp - len(p):Lp + len(a)] = True
            resp[i, Lp:Lp + len(a)] = True
        return Batch(tokens=tokens, attn_mask=attn, response_mask=resp, rollout_logp=torch.zeros(len(rows), Lp + N - 1),
                     routes=None, rewards=torch.zeros(len(rows)),
                     group=torch.arange(len(prompts)).repeat_interleave(group_size))


def test_evaluate_reports_greedy_and_sampled_accuracy():
    task = make_task("sort:4-4")
    ex = heldout_examples(task, 6)
    oracle = Oracle(ex)
    m = evaluate(oracle, task, ex, max_new_tokens=5, eos_ids=(EOS,), pad_id=PAD, samples=3, prompts_per_batch=4)
    assert m["eval/accuracy_greedy"] == 1.0 and m["eval/reward_greedy"] == 1.0 and m["eval/accuracy"] == 0.0
    assert m["eval/reward"] == pytest.approx(4 / 5) and m["eval/n"] == 6 and m["eval/response_length"] == 5
    m = evaluate(build_model(CFG, 0), task, ex, max_new_tokens=5, eos_ids=(EOS,), pad_id=PAD, samples=2)
    assert 0 <= m["eval/accuracy"] <= m["eval/reward"] <= 1 and 0 <= m["eval/accuracy_greedy"] <= 1
    assert evaluate(build_model(CFG, 0), task, ex, max_new_tokens=5, eos_ids=(EOS,), pad_id=PAD, samples=2) == m
