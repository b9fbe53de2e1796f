"""What this proves: every train.py flag that could invert or void training, crash after work was done, or hang on
an unbounded size is refused before any work with a message that states its domain (issue 10, class 7); --r3 is
--replay r3; args.json round-trips the config; the derived defaults (clip range by loss, chunk by vocabulary, shards by
world size) are computed, never written back."""
import re
from dataclasses import asdict

import pytest

from r3.train.config import RUN_DEFINING, RolloutConfig, TrainConfig, parse


@pytest.mark.parametrize("flag, value, domain", [
    ("--grad-clip", "-1", "> 0"), ("--grad-clip", "0", "> 0"), ("--is-cap", "-1", ">= 1"), ("--is-cap", "0.5", ">= 1"),
    ("--temperature", "-1", "> 0 and finite"), ("--temperature", "0", "> 0 and finite"),
    ("--temperature", "nan", "> 0 and finite"), ("--top-p", "0", r"in \(0, 1\]"), ("--top-p", "1.1", r"in \(0, 1\]"),
    ("--lr", "inf", "> 0 and finite"), ("--lr", "-3e-4", "> 0 and finite"), ("--save-every", "0", ">= 1"),
    ("--val-prompts", "0", r"in \[1, 65536\]"), ("--val-every", "-1", ">= 0"), ("--eval-every", "-5", ">= 0"),
    ("--steps", "0", ">= 1"), ("--mini-steps", "0", ">= 1"), ("--max-new-tokens", "0", ">= 1"),
    ("--group-size", "1", ">= 2"), ("--clip-low", "-0.1", ">= 0"), ("--guard-kl-max", "nan", "> 0"),
    ("--prompts-per-step", "1000000000", r"in \[1, 65536\]"), ("--group-size", "5000", r"in \[1, 1024\]"),
    ("--eval-prompts", "99999999", r"in \[1, 65536\]"), ("--threads", "1000000000", r"in \[1, 1024\]"),
])
def test_train_flags_outside_their_domain_are_refused(flag, value, domain, capsys):
    with pytest.raises(SystemExit):
        parse(TrainConfig, [f"{flag}={value}"])
    err = capsys.readouterr().err
    assert flag in err and re.search(domain, err), err


def test_rows_per_step_are_bounded(capsys):
    with pytest.raises(SystemExit):
        parse(TrainConfig, ["--prompts-per-step", "65536", "--group-size", "1024"])
    assert "at most 1048576" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(RolloutConfig, ["--out", "x", "--num-prompts", "1000000000"])
    assert "in [1, 65536]" in capsys.readouterr().err


def test_r3_is_replay_r3_and_the_config_round_trips():
    cfg = parse(TrainConfig, ["--r3", "--loss", "gspo"])
    assert cfg.replay == "r3" and cfg.clip_range == (3e-4, 4e-4)  # GSPO's sequence-level defaults
    assert TrainConfig(**asdict(cfg)) == cfg  # args.json is asdict(config)
    assert cfg.clip_low is None and cfg.logprob_chunk is None  # derived values are not written back
    assert cfg.chunk_for(16) == 0 and cfg.chunk_for(151936) == 1024 and cfg.num_shards(4) == 4
    assert set(RUN_DEFINING) <= set(asdict(cfg))
    with pytest.raises(SystemExit):
        parse(TrainConfig, ["--r3", "--replay", "r2"])


def test_rollout_shares_the_names_and_keeps_its_init_seed():
    r = parse(RolloutConfig, ["--out", "x", "--num-prompts", "5", "--seed", "3"])
    assert r.prompts_per_step == 5 and r.seed == 3 and r.model_seed == 0  # rollout.py: init seed 0 unless given
    assert parse(TrainConfig, ["--seed", "3"]).model_seed == 3  # train.py: the init seed follows --seed
    with pytest.raises(SystemExit):
        parse(RolloutConfig, [])  # --out is required
