"""What this proves: the inspector's per-token numbers are r3/train/score.py's (their mismatch metrics equal
`old_policy_pass` on the same batch, without and with R3), a sample dump round-trips, the HTML page has the promised
structure (one coloured, titled span per response token, flipped layers marked, a per-layer SVG histogram, no
script), and `python -m r3.inspect` runs end to end on a rollout folder and on a run folder's dumps."""
import json
import os
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import torch

from r3.rollout.batch import load_batch, save_batch
from r3.tools.inspect import dump_samples, load_scores, pick_rows, render_html, summarize, token_namer, token_scores
from r3.train.metrics import mismatch
from r3.model.model import PRESETS, ModelConfig, build_model
from r3.train.collect import rollout
from r3.train.score import old_policy_pass, score
from r3.tasks.tasks import make_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def fp8():
    """The random-init toy MoE and an fp8 rollout of it: flips are common (in 10 of the 12 rows)."""
    model = build_model(PRESETS["toy"], 0).float().eval()
    batch, _ = rollout(model, make_task("sort:3-5"), num_prompts=6, group_size=2, dtype="fp8", seed=1)
    return model, batch


def test_numbers_are_score_py_and_match_mismatch_metrics(fp8):
    model, batch = fp8
    sc = token_scores(model, batch)
    with torch.no_grad():
        assert torch.equal(sc["logp_normal"], score(model, batch, replay=False).logp)
        assert torch.equal(sc["logp_r3"], score(model, batch, replay=True).logp)
    mask = batch.loss_mask
    assert sc["flipped"].any(), "the test needs flips"
    assert not (sc["flipped"] & ~mask[..., None]).any() and not (sc["entropy"] * ~mask).any()
    s = summarize(batch, sc)
    for arm, replay in (("normal", False), ("r3", True)):
        ref = old_policy_pass(model, batch, replay="r3" if replay else "none",
                              temperature=batch.meta["temperature"]).metrics
        mine = mismatch(sc[f"logp_{arm}"], batch.rollout_logp, mask)
        assert mine["kl"] == ref["kl"] and mine["extreme_frac"] == ref["extreme_frac"]
        assert s[arm]["kl"] == ref["kl"] and s[arm]["extreme_frac"] == ref["extreme_frac"]
        for k in ("router_flip_rate", "token_flip_rate", "flips_per_token"):
            assert s[k] == ref[k], k
    assert s["normal"]["flipped"]["tokens"] + s["normal"]["unflipped"]["tokens"] == s["tokens"] == int(mask.sum())
    assert abs(sum(s["layer_flip_rate"]) / len(s["layer_flip_rate"]) - s["router_flip_rate"]) < 1e-12


def test_dump_round_trips(fp8, tmp_path):
    model, batch = fp8
    dump_samples(str(tmp_path / "step3"), batch, model, rows=5)
    b, sc = load_batch(str(tmp_path / "step3")), load_scores(str(tmp_path / "step3"))
    assert len(b) == 5 and torch.equal(b.tokens, batch.tokens[:5])
    ref = token_scores(model, batch.select(slice(0, 5)))
    for k, v in ref.items():
        assert torch.equal(sc[k], v), k


class Tree(HTMLParser):
    """Collects every element as (tag, attrs, text) and checks nesting of the token spans."""

    def __init__(self):
        super().__init__()
        self.stack, self.elems = [], []

    def handle_starttag(self, tag, attrs):
        e = dict(tag=tag, attrs=dict(attrs), text="", parents=[p["attrs"].get("class", "") for p in self.stack])
        self.elems.append(e)
        if tag not in ("meta", "br", "img", "hr"):  # void elements have no end tag
            self.stack.append(e)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1]["tag"] == tag, f"unbalanced </{tag}>"
        self.stack.pop()

    def handle_data(self, data):
        if self.stack:
            self.stack[-1]["text"] += data


def test_html_structure(fp8):
    model, batch = fp8
    sc = token_scores(model, batch)
    s = summarize(batch, sc)
    rows = pick_rows(batch, sc, 4, "first")
    page = render_html(batch, sc, s, rows, token_namer(16), "t <title>")
    t = Tree()
    t.feed(page)
    t.close()
    assert not t.stack and page.startswith("<!doctype html>")
    tags = [e["tag"] for e in t.elems]
    assert "script" not in tags and "link" not in tags and "style" in tags  # self-contained
    assert [e["attrs"]["id"] for e in t.elems if e["attrs"].get("class") == "row"] == [f"row-{r}" for r in rows]
    for arm in ("normal", "r3"):
        lines = [e for e in t.elems if e["attrs"].get("class") == f"line {arm}"]
        assert len(lines) == len(rows)
    toks = [e for e in t.elems if e["attrs"].get("class", "").startswith("tok") and "prompt" not in e["attrs"]["class"]]
    assert len(toks) == 2 * int(batch.loss_mask[rows].sum())
    assert all("background:rgb(" in e["attrs"]["style"] and "engine logp" in e["attrs"]["title"] for e in toks)
    flipped = [e for e in toks if "flipped" in e["attrs"]["class"]]
    under = [e for e in t.elems if e["attrs"].get("class") == "fl"]
    n_flipped = int(sc["flipped"][rows].any(-1).sum())
    assert n_flipped > 0 and len(flipped) == len(under) == n_flipped
    assert all(u["text"].startswith("L") and "tok flipped" in u["parents"][-1] for u in under)
    assert all("flipped layers: none" not in e["attrs"]["title"] for e in flipped)
    assert tags.count("svg") == 1
    rects = [e for e in t.elems if e["tag"] == "rect"]
    assert len(rects) == PRESETS["toy"].num_hidden_layers
    cells = [e for e in t.elems if e["tag"] == "td"]
    assert any(c["text"].startswith("mean |log r| on flipped tokens") for c in cells)
    assert "&lt;title&gt;" in page  # text is escaped


def test_dense_batch_renders_one_line_per_row():
    model = build_model(CFG.dense_twin(), 0).float().eval()
    batch, _ = rollout(model, make_task("sort:3-4"), num_prompts=2, group_size=2, dtype="bf16", seed=0)
    sc = token_scores(model, batch)
    assert "logp_r3" not in sc and "flipped" not in sc
    s = summarize(batch, sc)
    page = render_html(batch, sc, s, [0, 1], token_namer(16), "dense")
    assert page.count('class="line normal"') == 2 and 'class="line r3"' not in page and "<svg" not in page


def cli(*args, cwd=ROOT):
    r = subprocess.run([sys.executable, "-m", "r3.inspect", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_cli_on_a_rollout_folder(tmp_path):
    model = build_model(PRESETS["toy"], 0).float().eval()  # what `--preset toy --warmup-steps 0` builds
    batch, _ = rollout(model, make_task("sort:3-4"), num_prompts=3, group_size=2, dtype="fp8", seed=0)
    save_batch(batch, str(tmp_path / "roll"))
    out = cli(str(tmp_path / "roll"), "--warmup-steps", "0", "--task", "sort:3-4", "--out", str(tmp_path / "x"),
              "--cache-dir", str(tmp_path / "cache"))
    assert "no replay" in out and "flipped layers" in out and "warning" not in out
    for ext in ("html", "png", "json"):
        assert (tmp_path / f"x.{ext}").stat().st_size > 0
    s = json.loads((tmp_path / "x.json").read_text())
    ref = old_policy_pass(model, batch, replay="none").metrics
    assert s["normal"]["kl"] == ref["kl"] and s["router_flip_rate"] == ref["router_flip_rate"]
    assert s["r3"]["kl"] == old_policy_pass(model, batch, replay="r3").metrics["kl"]


def test_cli_on_a_run_folder(fp8, tmp_path):
    model, batch = fp8
    run = tmp_path / "run"
    for step in (0, 5):
        dump_samples(str(run / "samples" / f"step{step}"), batch, model, rows=2 + step)
    (run / "args.json").write_text(json.dumps(dict(task="sort:3-5", model=None)))
    cli(str(run), "--no-png")  # the latest dump, by default written beside it
    assert (run / "samples" / "step5" / "inspect.html").exists()
    assert json.loads((run / "samples" / "step5" / "inspect.json").read_text())["rows"] == 7
    cli(str(run), "--step", "0", "--no-html", "--no-png")
    assert json.loads((run / "samples" / "step0" / "inspect.json").read_text())["rows"] == 2
    r = subprocess.run([sys.executable, "-m", "r3.inspect", str(run), "--step", "9"], cwd=ROOT, capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode != 0 and "dumped steps: [0, 5]" in r.stderr
