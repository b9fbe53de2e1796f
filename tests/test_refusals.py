"""What this proves (issues 23, 38): each user mistake at the command line of train.py, rollout.py, r3.check,
r3.inspect and r3.serve ends in exactly one `error: ...` line on stderr that names what is wrong and where, exit status
1 (2 for a flag outside its domain), no traceback, and nothing trained or written: a missing, empty or gapped rollouts
folder, a killed writer's stepN.tmp, rollouts from another model (trained on only with --allow-other-model),
--mini-steps beyond the rows, an unbounded size, an unparsable --task, a bad or missing JSONL task file, a missing or
non-Qwen3-MoE --model, --out on or below a file, an empty or NaN ckpt.pt, a resume with changed flags (another
preset, seed, task or --dense: refused before the warm-up builds the model), a meta.temperature string, an
unreachable server, an HF shard with a NaN, a --port, --threads, --warmup-steps or --rows of r3.serve, r3.check or
r3.inspect outside its domain. A leftover stepN.tmp beside a complete stepN gets a one-line note and the run trains."""
import json
import math
import os
import shutil
import sys

import pytest
import torch

import rollout
import train
from r3.tools import check, inspect, serve
from r3.rollout.batch import load_batch, save_batch
from r3.errors import run_main
from r3.scale.hf import save_pretrained
from r3.model.model import ModelConfig, build_model

TINY = ["--prompts-per-step", "3", "--group-size", "2", "--warmup-steps", "3", "--task", "sort:3-4", "--val-every",
        "0", "--eval-prompts", "8", "--eval-samples", "2", "--no-plot", "--quiet", "--steps", "2"]
SAMPLE = ["--preset", "toy", "--task", "sort:3-4", "--warmup-steps", "3", "--prompts-per-step", "3", "--group-size",
          "2", "--no-mismatch", "--no-progress"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A working folder shared by the module (one warm-up cache) holding two rollout folders of two steps each:
    `rollouts` sampled by the model TINY trains, `other` by a random-init model (--warmup-steps 0)."""
    d = tmp_path_factory.mktemp("work")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        for name, extra in (("rollouts", []), ("other", ["--warmup-steps", "0"])):
            for step in (0, 1):
                rollout.main([*SAMPLE, *extra, "--seed", str(step), "--out", f"{name}/step{step}"])
    finally:
        os.chdir(cwd)
    return d


@pytest.fixture
def cwd(work, monkeypatch):
    monkeypatch.chdir(work)
    return work


def snapshot(path) -> dict:
    """Every file below `path` with its bytes: equal before and after means nothing was written there."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = fh.read()
    return out


def refused(main, argv, capsys, monkeypatch, code=1) -> str:
    """Run `main` as its script does (through run_main); return the one error line after checking the exit status,
    that stderr ends with it, holds no other and no traceback (progress bars aside)."""
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    with pytest.raises(SystemExit) as e:
        run_main(main)
    err = capsys.readouterr().err
    assert e.value.code == code, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [x for x in err.replace("\r", "\n").splitlines() if x.strip()]
    errors = [x for x in lines if "error: " in x]
    assert len(errors) == 1 and lines[-1] == errors[0], lines[-5:]
    return errors[0]


def train_refused(argv, capsys, monkeypatch, out="run", code=1) -> str:
    line = refused(train.main, [*TINY, "--out", out, *argv], capsys, monkeypatch, code)
    assert not os.path.isdir(out) or not ({"metrics.jsonl", "ckpt.pt"} & set(os.listdir(out)))  # nothing trained
    return line


def copy_rollouts(cwd, name: str, src: str = "rollouts") -> str:
    shutil.rmtree(name, ignore_errors=True)
    shutil.copytree(src, name)
    return name


# ------------------------------------------------------------------------------------------------ train.py inputs
def test_missing_and_empty_rollouts_folders(cwd, capsys, monkeypatch):
    line = train_refused(["--rollouts", "nowhere"], capsys, monkeypatch)
    assert line == "error: rollout folder 'nowhere' does not exist"
    os.makedirs("empty/sub", exist_ok=True)
    (cwd / "empty" / "sub" / "notes.txt").write_text("not a rollout")
    line = train_refused(["--rollouts", "empty"], capsys, monkeypatch)
    assert line == "error: no rollout folders (with manifest.json) under 'empty'"
    assert not os.path.exists("run")  # refused before the run folder was made


def test_a_step_folder_without_its_manifest_is_a_gap(cwd, capsys, monkeypatch):
    d = copy_rollouts(cwd, "gap")
    os.remove(f"{d}/step1/manifest.json")
    before = snapshot(d)
    line = train_refused(["--rollouts", d], capsys, monkeypatch)
    assert "step folder gap/step1 holds ['batch.safetensors', 'summary.json'] but no manifest.json" in line
    os.makedirs(f"{d}/step2")
    shutil.rmtree(f"{d}/step1")
    assert "step folder gap/step2 is empty and has no manifest.json" in train_refused(["--rollouts", d], capsys,
                                                                                      monkeypatch)
    assert snapshot(d) == {k: v for k, v in before.items() if not k.startswith("step1")}


def test_a_killed_writers_tmp_copy_is_refused_alone_and_noted_beside_its_folder(cwd, capsys, monkeypatch):
    d = copy_rollouts(cwd, "killed")
    os.rename(f"{d}/step1", f"{d}/step1.tmp")  # rollout.py killed before its rename: step1 never appeared
    line = train_refused(["--rollouts", d], capsys, monkeypatch)
    assert "killed/step1.tmp is a copy left by a killed write (rollout.py?) and killed/step1 does not exist" in line
    shutil.copytree(f"{d}/step1.tmp", f"{d}/step1")  # a killed rewrite: step1 is whole
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, "--out", "noted", "--rollouts", d])
    run_main(train.main)
    err = capsys.readouterr().err
    assert err.count("note: skipping killed/step1.tmp, left by a killed rewrite of killed/step1") == 1
    assert len(open("noted/metrics.jsonl").readlines()) == 2


def test_rollouts_of_another_model_need_allow_other_model(cwd, capsys, monkeypatch):
    line = train_refused(["--rollouts", "other", "--out", "o1"], capsys, monkeypatch, out="o1")
    assert line.startswith("error: other/step0 was sampled by another model (preset toy, random init seed 0; 2 of 2 "
                           "batches) than the one this run starts from")
    assert line.endswith("or --allow-other-model if you mean it")
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, "--out", "o2", "--rollouts", "other", "--allow-other-model"])
    run_main(train.main)
    assert "warning: other/step0 was sampled by another model" in capsys.readouterr().out
    assert len(open("o2/metrics.jsonl").readlines()) == 2
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, "--out", "o3", "--rollouts", "rollouts"])  # its own: no word
    run_main(train.main)
    assert "another model" not in capsys.readouterr().out


def test_mini_steps_beyond_the_rows(cwd, capsys, monkeypatch):
    line = train_refused(["--mini-steps", "1000"], capsys, monkeypatch)
    assert line == ("error: --mini-steps 1000 is more than the 6 rows of a step (per data shard): each minibatch "
                    "needs a row; pass --mini-steps 6 or fewer, or more rows")
    line = train_refused(["--mini-steps", "7", "--rollouts", "rollouts"], capsys, monkeypatch)
    assert line.startswith("error: --mini-steps 7 is more than the 6 rows of rollouts/step0")


def test_sizes_are_bounded_in_one_line(cwd, capsys, monkeypatch):
    line = train_refused(["--prompts-per-step", "1000000000"], capsys, monkeypatch, code=2)
    assert line == "prog: error: --prompts-per-step must be in [1, 65536], got 1000000000"


def test_task_model_and_out_mistakes(cwd, capsys, monkeypatch):
    assert train_refused(["--task", "cipher:99-3"], capsys, monkeypatch) == \
        "error: bad length range in task 'cipher:99-3': need 1 <= MIN <= MAX"
    (cwd / "q.jsonl").write_text('{"prompt": "1+1?", "answer": "2"}\n')
    jsonl = ["--task", "jsonl:q.jsonl"]
    assert train_refused(["--model", "nomodel", *jsonl], capsys, monkeypatch) == \
        "error: model folder 'nomodel' does not exist"
    os.makedirs("notqwen", exist_ok=True)
    assert train_refused(["--model", "notqwen", *jsonl], capsys, monkeypatch) == \
        "error: 'notqwen' has no config.json: not an HF checkpoint folder"
    (cwd / "notqwen" / "config.json").write_text(json.dumps(dict(architectures=["LlamaForCausalLM"])))
    assert train_refused(["--model", "notqwen", *jsonl], capsys, monkeypatch) == \
        "error: notqwen/config.json: architectures=['LlamaForCausalLM']; only Qwen3MoeForCausalLM is supported"
    (cwd / "afile").write_text("x")
    assert train_refused([], capsys, monkeypatch, out="afile") == f"error: --out {cwd}/afile is a file, not a folder"
    assert train_refused([], capsys, monkeypatch, out="afile/run") == \
        f"error: --out {cwd}/afile/run: {cwd}/afile is a file, so no folder can be made below it"
    assert (cwd / "afile").read_text() == "x"


def test_an_unreachable_server(cwd, capsys, monkeypatch):
    line = train_refused(["--engine", "sglang:http://127.0.0.1:9", "--engine-wait", "0"], capsys, monkeypatch)
    assert "cannot reach the server" in line and "127.0.0.1:9" in line


def test_a_meta_temperature_string_in_a_manifest(cwd, capsys, monkeypatch):
    d = copy_rollouts(cwd, "hot")
    b = load_batch(f"{d}/step1")
    b.meta["temperature"] = "hot"
    save_batch(b, f"{d}/step1")  # a writer that stored the flag's text: the checksum is right, the value is not
    line = train_refused(["--rollouts", d], capsys, monkeypatch)
    assert line == ("error: hot/step1: meta.temperature is 'hot', expected a number >= 0 (the engine's sampling "
                    "temperature; 0 = greedy)")


@pytest.mark.parametrize("damage, words", [
    (lambda path: open(path, "wb").close(), r"ckpt.pt' is empty \(0 bytes\)"),
    (lambda path: torch.save(_nan_lm_head(path), path), "tensor 'model.lm_head.weight' holds 1 non-finite value"),
])
def test_resume_from_a_damaged_checkpoint_changes_nothing(cwd, capsys, monkeypatch, damage, words):
    shutil.rmtree("resumed", ignore_errors=True)
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, "--out", "resumed"])
    run_main(train.main)
    damage("resumed/ckpt.pt")
    before = snapshot("resumed")
    line = refused(train.main, [*TINY, "--out", "resumed", "--resume", "--steps", "3"], capsys, monkeypatch)
    assert line.startswith("error: cannot resume resumed: ") and __import__("re").search(words, line), line
    assert snapshot("resumed") == before


def _nan_lm_head(path):
    s = torch.load(path, weights_only=True)
    s["model"]["lm_head.weight"][0, 0] = math.nan
    return s


def test_a_resume_with_changed_flags_is_one_line(cwd, capsys, monkeypatch):
    shutil.rmtree("changed", ignore_errors=True)
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, "--out", "changed"])
    run_main(train.main)
    before = snapshot("changed")
    line = refused(train.main, [*TINY, "--out", "changed", "--resume", "--lr", "1e-3", "--r3"], capsys, monkeypatch)
    assert line == ("error: cannot resume changed: the resumed run differs from the saved one in 2 field(s) that "
                    "define it: replay: saved 'none', now 'r3'; lr: saved 0.0003, now 0.001; pass the saved values, "
                    "or allow the change explicitly (--allow-change replay,lr)")
    assert snapshot("changed") == before


@pytest.mark.parametrize("change, field", [(["--preset", "toy-wide"], "preset"), (["--seed", "1"], "seed"),
                                           (["--task", "sort:4-5"], "task"), (["--dense"], "dense")])
def test_a_resume_with_another_model_is_refused_before_the_warmup(cwd, capsys, monkeypatch, change, field):
    if not os.path.exists("remodel/ckpt.pt"):  # one finished run, shared by the cases
        monkeypatch.setattr(sys, "argv", ["train.py", *TINY, "--out", "remodel"])
        run_main(train.main)
    before = snapshot(".")  # the whole working folder, the warm-up cache included
    monkeypatch.setattr(train, "load_policy_and_task", lambda *a: pytest.fail("the model was built before the refusal"))
    line = refused(train.main, [*TINY, "--out", "remodel", "--resume", *change], capsys, monkeypatch)
    assert line.startswith("error: cannot resume remodel: the resumed run differs from the saved one in 1 field(s) "
                           f"that define it: {field}: saved "), line
    assert snapshot(".") == before


# --------------------------------------------------------------------------------- rollout.py, r3.check, r3.inspect
def test_rollout_out_mistakes_are_refused_before_sampling(cwd, capsys, monkeypatch):
    (cwd / "afile").write_text("x")
    os.makedirs("mine", exist_ok=True)
    (cwd / "mine" / "notes.txt").write_text("keep")
    for out, words in (("afile", "error: 'afile' is a file; a rollout batch is a folder"),
                       ("afile/sub", f"error: cannot write a rollout batch to 'afile/sub': {cwd}/afile is a file"),
                       ("mine", "error: refusing to replace 'mine' with a rollout batch: it holds other files "
                                "['notes.txt']")):
        assert refused(rollout.main, [*SAMPLE, "--out", out], capsys, monkeypatch) == words
    assert (cwd / "afile").read_text() == "x" and os.listdir("mine") == ["notes.txt"]
    assert refused(rollout.main, [*SAMPLE, "--task", "cipher:99-3", "--out", "new"], capsys, monkeypatch) == \
        "error: bad length range in task 'cipher:99-3': need 1 <= MIN <= MAX"
    line = refused(rollout.main, [*SAMPLE, "--model", "nomodel", "--out", "new"], capsys, monkeypatch)
    assert line == "error: --model 'nomodel' is neither an HF checkpoint folder nor a safetensors file (save_weights)"
    assert not os.path.exists("new") and not os.path.exists("new.tmp")


def test_check_and_inspect_mistakes(cwd, capsys, monkeypatch):
    flags = ["--preset", "toy", "--task", "sort:3-4", "--warmup-steps", "3"]
    assert refused(check.main, ["--rollouts", "nowhere", *flags], capsys, monkeypatch) == \
        "error: rollout folder 'nowhere' does not exist"
    os.makedirs("void", exist_ok=True)
    assert refused(check.main, ["--rollouts", "void", *flags], capsys, monkeypatch) == \
        "error: no rollout folders (with manifest.json) under 'void'"
    cfg = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)
    model = build_model(cfg, 0)
    with torch.no_grad():
        model.model.norm.weight[3] = math.nan
    save_pretrained(model, "nanmodel")
    line = refused(check.main, ["--rollouts", "rollouts", "--model", "nanmodel"], capsys, monkeypatch)
    assert line == ("error: nanmodel/model.safetensors: tensor 'model.norm.weight' holds 1 non-finite value(s) "
                    "(first at index [3]: nan); the weights are damaged")
    assert refused(inspect.main, ["nowhere"], capsys, monkeypatch) == "error: nowhere does not exist"
    assert refused(inspect.main, ["void"], capsys, monkeypatch).startswith(
        "error: void: neither a rollout folder (manifest.json) nor a run folder with sample dumps")
    assert os.listdir("void") == []


@pytest.mark.parametrize("main, argv, line", [
    (serve.main, ["--port", "-5"], "--port must be in [0, 65535] (0 = a free one), got -5"),
    (serve.main, ["--port", "70000"], "--port must be in [0, 65535] (0 = a free one), got 70000"),
    (serve.main, ["--threads", "0"], "--threads must be in [1, 1024], got 0"),
    (check.main, ["--rollouts", "rollouts", "--preset", "toy", "--threads", "0"],
     "--threads must be in [1, 1024], got 0"),
    (check.main, ["--rollouts", "rollouts", "--preset", "toy", "--warmup-steps", "-5"],
     "--warmup-steps must be >= 0, got -5"),
    (inspect.main, ["rollouts/step0", "--rows", "-3"], "--rows must be >= 0, got -3"),
    (inspect.main, ["rollouts/step0", "--png-rows", "-1"], "--png-rows must be >= 0, got -1"),
])
def test_check_inspect_and_serve_flags_outside_their_domain(cwd, capsys, monkeypatch, main, argv, line):
    before = snapshot(".")
    assert refused(main, argv, capsys, monkeypatch, code=2) == "prog: error: " + line
    assert snapshot(".") == before  # refused before any work: no warm-up, no page, no server


def test_jsonl_task_mistakes_with_a_checkpoint(cwd, capsys, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "user", "assistant", "\n", "a", "b", "[UNK]"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("\n", "isolated")
    cfg = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)
    save_pretrained(build_model(cfg, 0), "qwen")
    tok.save("qwen/tokenizer.json")
    (cwd / "bad.jsonl").write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "a", \n')
    model = ["--model", "qwen", "--max-new-tokens", "4"]
    assert train_refused([*model, "--task", "jsonl:bad.jsonl"], capsys, monkeypatch).startswith(
        "error: bad.jsonl:2: not valid JSON")
    assert train_refused([*model, "--task", "jsonl:missing.jsonl"], capsys, monkeypatch) == \
        "error: task file 'missing.jsonl' (from 'jsonl:missing.jsonl') does not exist"
