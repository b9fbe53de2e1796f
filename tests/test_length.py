"""What this proves: chain:T is a long-answer task with a two-token prompt whose reward scores each position against
the permutation of the response's own previous token (one slip costs one position, not the rest); presets widen
their positions to fit it; and experiments.length runs its grid end to end at a tiny size (every cell and control,
ESS and Var[log w] telemetry, T*, tests, figure), extrapolates the 5 % ESS length per sampled token, reports a
partial grid as partial, and runs its positive controls only after no replay has fallen at the longest length."""
import json
import os
import subprocess
import sys

import torch

from r3.tasks.tasks import EOS, SYMBOL0, Cipher, make_task
from r3.train.warmup import preset_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)


def test_chain_task():
    task = make_task("chain:12")
    ex = task.sample(1, torch.Generator().manual_seed(0))[0]
    assert len(ex.prompt) == 2 and len(ex.answer) == 12 and task.max_new_tokens == 13
    prev = ex.prompt[0]
    for tok in ex.answer:  # each answer token is PI of the one before it
        assert tok == SYMBOL0 + Cipher.PI[prev - SYMBOL0]
        prev = tok
    assert task.reward(ex.answer + [EOS], ex) == (1.0, {"exact": True})
    slip = list(ex.answer)
    slip[4] = SYMBOL0 + (slip[4] - SYMBOL0 + 1) % 64  # one wrong token, then the chain continued from it
    for i in range(5, 12):
        slip[i] = SYMBOL0 + Cipher.PI[slip[i - 1] - SYMBOL0]
    assert task.reward(slip + [EOS], ex)[0] == 12 / 13
    assert task.reward(ex.answer[:6], ex)[0] == 6 / 13  # stopped early: the missing positions score nothing
    assert preset_config("toy", make_task("chain:1000")).max_position_embeddings == 1002 + 1
    assert preset_config("toy", make_task("cipher")).max_position_embeddings == 256  # the others keep the preset
    ex.answer[0] = -1  # answers are cached per start symbol and handed out as copies: editing one changes no other
    again = task.sample(1, torch.Generator().manual_seed(0))[0]
    assert again.prompt == ex.prompt and again.answer[0] == SYMBOL0 + Cipher.PI[ex.prompt[0] - SYMBOL0]


def test_the_5_percent_ess_length_is_extrapolated_per_sampled_token():
    """Responses that stop at a quarter of T: Var[log w] grows with the tokens sampled, not with the nominal T."""
    from experiments.length.grid import extrapolate
    run = lambda T, var: dict(length=T, mean_response_length=T / 4, mean_var_log_w=var)  # noqa: E731
    summ = {"fp8-router/none/T64": {"runs": {"0": run(64, 0.016)}},  # 0.001 per sampled token
            "fp8-router/none/T256": {"runs": {"0": run(256, 0.064)}},
            "fp8-router/r3/T256": {"runs": {"0": run(256, 9.0)}}}  # other arms are not in the fit
    slope, slope_T, text = extrapolate(summ)
    assert abs(slope - 1e-3) < 1e-12 and abs(slope_T - 2.5e-4) < 1e-12
    assert "responses of ≈ 2996 tokens" in text and "T ≈ 11983" in text  # ln 20 / slope
    assert extrapolate({}) == (None, None, "")


def test_positive_controls_run_only_after_a_fall_of_no_replay_at_the_longest_length():
    from experiments.length.grid import controls_needed

    def summ(*steps):  # (primary, secondary) collapse steps of no replay's finished seeds at T = 8
        runs = {i: dict(collapse_step=a, secondary_step=b) for i, (a, b) in enumerate(steps)}
        return {"fp8-router/none/T8": dict(n=len(runs), runs=runs)}
    assert controls_needed(summ((None, None)), [4, 8], 2)[0] is False  # waiting for seed 1
    assert "waiting: 1 of 2" in controls_needed(summ((None, None)), [4, 8], 2)[1]
    assert controls_needed(summ((None, None), (None, None)), [4, 8], 2) == (
        False, "not run: the no-replay arm collapsed in none of its 2 seeds at T = 8, under either rule, so the "
               "prediction that MIS and TIS stabilise it cannot be tested here")
    assert controls_needed(summ((None, None), (None, 120)), [4, 8], 2)[0] is True  # the secondary rule counts
    assert controls_needed(summ((90, 90), (None, None)), [4, 8], 2) == (True, "run: no replay collapsed in 1 of 2 "
                                                                               "seeds at T = 8")


def test_length_grid_end_to_end(tmp_path):
    common = ("--preset toy --warmup-steps 3 --prompts-per-step 2 --group-size 2 --mini-steps 1 --loss seq_is "
              "--old-logp engine --grad-clip inf --eval-every 1 --eval-prompts 2 --eval-samples 1 --val-every 0 "
              "--dump-every 0 --mismatch-every 1")
    cmd = [sys.executable, "-m", "experiments.length", "--lengths", "4", "8", "--seeds", "0", "--steps", "2",
           "--common", common, "--out", "out", "--controls", "always"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "grid.json").read_text())
    assert data["complete"] and len(data["cells"]) == 3 * 2 + 2
    assert {"fp8-router/none+mis/T8", "fp8-router/none+tis/T8"} <= set(data["cells"]) and data["controls_run"]
    assert data["cells"]["fp8-router/none+mis/T8"]["n"] == 1  # the controls ran
    run = data["cells"]["fp8-router/none/T8"]["runs"]["0"]
    assert 0 < run["mean_ess"] <= 1 and run["mean_var_log_w"] >= 0 and run["predicted_var_log_w"] >= 0
    assert 0 < run["mean_response_length"] <= 8 + 1
    assert set(data["t_star"]) == {"fp8-router/none", "fp8-router/r3", "fp32/none", "fp8-router/none+mis",
                                   "fp8-router/none+tis"}
    assert set(data["t_star_relative"]) == set(data["t_star"])
    assert {t["metric"] for t in data["tests"]} == {"collapsed", "collapsed_relative", "max_drawdown"}
    assert all("secondary_step" in r for c in data["cells"].values() for r in c["runs"].values())
    assert (tmp_path / "out" / "grid.png").stat().st_size > 10_000
    fell = any(v["collapse_step"] is not None or v["secondary_step"] is not None
               for v in data["cells"]["fp8-router/none/T8"]["runs"].values())
    r = subprocess.run([*cmd, "--report", "--controls", "auto"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=ENV)  # the default gate, on the same finished runs
    auto = json.loads((tmp_path / "out" / "grid.json").read_text())
    assert r.returncode == 0 and auto["controls_run"] == fell and auto["complete"]
    assert ("positive controls: run: no replay collapsed" if fell else "positive controls: not run: the no-replay "
            "arm collapsed in none of its 1 seeds at T = 8") in r.stdout
    r = subprocess.run([*cmd, "--report", "--controls", "never"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=ENV)
    never = json.loads((tmp_path / "out" / "grid.json").read_text())
    assert r.returncode == 0 and never["complete"] and not never["controls_run"]  # the arms alone are complete
    assert "**partial**" not in r.stdout and "not run: --controls never" in r.stdout
    r = subprocess.run([*cmd, "--seeds", "0", "1", "--report", "--controls", "auto"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 0 and "**partial**" in r.stdout
    assert "waiting: 1 of 2 no-replay seeds at T = 8 have finished" in r.stdout
