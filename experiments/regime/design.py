"""The regime study's design, fixed before any measurement and any grid run: settings, dial positions, the depth
rule, the steps rule, the grid's cells, the collapse rule, the tests and the predictions. Nothing here is measured;
`measure.py`, `grid.py` and `report.py` read it. Written 2026-12-06, before the first regime measurement.

Every run is experiments.sweep's HEADLINE update (cipher:32-32, the toy, 16 prompts x 8 samples, lr 3e-4, the
engine's log-probs as π_old, PPO and gradient clipping off, held-out accuracy every 50 steps, the mismatch every 10)
with start-matched seeds (`--warmup-until 0.3`, at most WARMUP_CAP steps) and the trainer's greedy held-out accuracy
beside the engine's (`--eval-trainer`). Arms of a cell differ in --replay only; cells of a row in one flag.
"""
from experiments.sweep import HEADLINE

SEEDS = tuple(range(8))  # start-matched; seeds 8 and up are kept unused, for reruns of key cells
WARMUP_UNTIL, WARMUP_CAP = 0.3, 400
COMMON = HEADLINE.replace("--warmup-steps 80", f"--warmup-steps {WARMUP_CAP} --warmup-until {WARMUP_UNTIL}") + \
    " --eval-trainer"
assert COMMON != HEADLINE + " --eval-trainer", "HEADLINE's --warmup-steps changed: update COMMON"

# ------------------------------------------------------------------------------------------------- the dial
# A routing-mismatch dial on the engine only (`--router-levels N`, r3/model/quant.py `router_grid`): the fp8-router
# engine's router weight rounded per row to an N-point symmetric grid instead of e4m3 (N = 2^B - 1 is int-B).
# Positions, fixed before any RL run by this rule: the natural fp8-router engine, then int4, int3 and int2 (N = 15, 7,
# 3), the ladder of the probe in issue 37 (about 9, 17 and 47 % of routers differing, seed 0), which spans the paper's
# ~10 % of routers and its 94 % of tokens with a flip; and the 5-point grid (N = 5) between int3 and int2, where that
# probe's router flips jump from 17 to 47 %. The probe's int6 was dropped: it moved no more routers than fp8-router
# (3.0 % against ~2.5 %), and a 2-seed look at the start-of-RL flips here (2.7 % both; no RL run) said the same.
# N = 3 (ternary) is the strongest position; nothing coarser is a rounding.
ENGINE = "fp8-router"
POSITIONS = {"natural": None, "lv15": 15, "lv7": 7, "lv5": 5, "lv3": 3}  # name -> --router-levels (grid points)
STRONGEST = "lv3"
PAPER = dict(router_flip_rate=0.10, token_flip_rate=0.94, flips_per_token=6.0, kl=1.535e-3, kl_r3=0.75e-3,
             exposure=(3.0, 30.0))  # arXiv 2510.11370 (Qwen3-30B-A3B); S: the published collapses' range
PAPER_MATCHED_TEXT = ("the paper-matched position is the one whose router flip rate at the start of RL (mean over "
                      "seeds 0-7, regime table) is closest to the paper's 10 % (the figure a dial on the router moves "
                      "directly); the position whose token flip rate is closest to 94 % is marked too. If the "
                      "paper-matched position is the strongest, the next weaker one takes its place in the grid")

# ------------------------------------------------------------------------------------------- the deep preset
# Qwen3-30B-A3B's routing shape at toy width: 8 of 128 experts, norm_topk_prob, hidden 64, expert width 16,
# head_dim 16. Its depth, by a rule fixed before measuring:
DEPTHS = (6, 12, 24, 48)
DEPTH_SEEDS = (0, 1)
DEPTH_TOKEN_FLIPS = 0.90
DEPTH_TEXT = ("the deep preset's depth is the shallowest of 6, 12, 24, 48 layers at which the natural fp8-router "
              "engine flips at least 90 % of tokens (token flip rate at the start of RL, after the start-matched "
              "warm-up, mean over seeds 0 and 1, 64 prompts x 8 samples); depths are measured from the shallowest "
              "up and the first that passes is taken; if none passes, 48")

# ------------------------------------------------------------------------------------------- the walk task
# Tier 3, exposure S = response length x kl >= 3 at the paper-matched position: the entropy-keeping walk:T task
# (r3/tasks/tasks.py). T is the shortest of WALK_LENGTHS whose S, measured at the start of RL at the paper-matched
# position (mean over seeds 0 and 1), reaches 3; if none does, tier 3 is not run at S >= 3 and the report says what S
# is.
WALK_LENGTHS = (64, 256)

# --------------------------------------------------------------------------------------------- the regime table
MEASURE_PROMPTS, MEASURE_SAMPLES, MEASURE_SEED = 64, 8, 424_242  # one fixed probe batch per (model, setting)
AFTER_STEPS = 200  # "after 200 steps": the policy of the setting's none/n4 run at step 200 (its checkpoint)
QUANTILES = (0.5, 0.9, 0.99, 0.999)  # of |log r| over sampled response tokens

# ------------------------------------------------------------------------------------------------ the steps
STEPS_TEXT = ("steps per grid run: at least 600; a pilot of r3 at the strongest position (seeds 0 and 1, 1000 steps, "
              "its own folders) sets it: the first evaluation step after which the pilot's mean held-out accuracy "
              "never rises more than 0.02 above its value there, plus 100, rounded up to a multiple of 100, at least "
              "600 and at most 1000")
MIN_STEPS, PILOT_STEPS, PILOT_SEEDS = 600, 1000, (0, 1)

# ------------------------------------------------------------------------------------------------- the cells
# SETTING/ARM/nN. SETTING: a dial position (fp8-router engine, --router-levels), `oracle` (fp32 engine, no dial),
# `POSITION-clip` (the update real stacks use: PPO clip 0.2 / 0.28, gradient clip 1.0, the trainer's log-probs as
# π_old), `deep` (the deep preset, natural fp8-router), `walk` (walk:T at the paper-matched position).
CLIP_FLAGS = (("--clip-low", "0.2"), ("--clip-high", "0.28"), ("--grad-clip", "1.0"), ("--old-logp", "trainer"))


def base_setting(cell: str) -> str:
    """The setting a cell's flip rates are measured under: SETTING/ARM/nN -> SETTING without its variant
    (`lv3-clip/none/n4` -> `lv3`)."""
    return cell.split("/")[0].partition("-")[0]


def tier_cells(paper: str, deep: bool = True, walk: bool = True) -> dict:
    """{tier: [cells]} given the paper-matched position (a name from POSITIONS)."""
    t1 = [f"{p}/{a}/n4" for p in POSITIONS for a in ("none", "r3")]
    t1 += [f"{p}/r2/n4" for p in (STRONGEST, paper)] + ["oracle/none/n4"]
    t2 = [f"{p}/{a}/n1" for p in (STRONGEST, paper) for a in ("none", "r3")]
    t2 += [f"{STRONGEST}-clip/{a}/n4" for a in ("none", "r3")]
    t2 += [f"deep/{a}/n4" for a in ("none", "r3")] if deep else []
    t3 = [f"walk/{a}/n4" for a in ("none", "r3")] if walk else []
    return {1: t1, 2: t2, 3: t3}


DEEP_BUDGET_CORE_H = 8.0  # the deep cell's 16 runs
DEEP_STEPS_TEXT = ("the deep cell runs the grid's steps, or fewer when 16 runs of them would exceed 8 core-hours at "
                   "the deep preset's measured step time (regime.json timing; the grid's evaluations and fidelity "
                   "add about a tenth, counted): then the most steps, a multiple of 50, that fit")
# Added 2026-12-06 04:15, after the depth rule's 24-layer warm-ups hit the 400-step cap below the start target (sampled
# probe reward 0.17 and 0.08) and before any deep RL run or any grid run: a deep cell that cannot start matched, or
# cannot run long enough to climb, would spend its budget on runs that cannot fall.
DEEP_MIN_STEPS = 200
DEEP_RUN_TEXT = ("the deep cell runs only when its start-matched warm-up reached the target on both depth-rule seeds "
                 f"and at least {DEEP_MIN_STEPS} steps fit the budget; otherwise tier 2 goes on without it and the "
                 "report says why")

# ------------------------------------------------------------------------------------------- rule and tests
RULE_TEXT = ("sustained collapse (experiments.staleness's rule, unchanged) = first step where held-out accuracy <= "
             "its best so far - 0.3 at two consecutive evaluations (or at the last one), or reward EMA(0.9) <= its "
             "running peak (after step 5) - 0.3 for 50 consecutive steps, or loss / grad norm non-finite. Per run "
             "also: best and final held-out accuracy, held-out area (the mean of held-out accuracy over the run's "
             "evaluations), the largest drawdown, max grad norm, mean kl, and the kl trend (log10 of mean kl over "
             "the last 100 steps / the first 100)")
TESTS_TEXT = ("at each dial position and mini-step count, none vs r3: Fisher's exact test on sustained collapse "
              "counts; paired permutation tests (sign flips over seeds: the two arms of a seed share its warm-up and "
              "prompts) on held-out area and on max drawdown. Also none vs r2 and r2 vs r3 at the strongest and "
              "paper-matched positions, oracle/none vs STRONGEST/none, and the tier-2 and tier-3 pairs. The answer "
              "at 4 mini-steps: R3 holds where no replay collapses at a position when the Fisher p there is below "
              "0.05 after Holm's correction over the five positions, no replay collapsing more; held-out area is "
              "the secondary, Holm over the five likewise. Dose-response: per arm, a logistic fit of collapse (per "
              "run) on the position's measured router flip rate and on its token flip rate (regime table, start of "
              "RL), with the flip rate at which no replay's fitted collapse rate passes 0.5 and its 95 % interval "
              "(bootstrap over runs, 2000 draws, seed 0); survival curves (time to collapse) per cell")
SELECTION_TEXT = ("the most separating setting is the tier-1 position whose none vs r3 Fisher p (4 mini-steps) is "
                  "smallest (ties: the smaller paired held-out-area p, then the weaker position); it becomes "
                  "experiments.collapse's default (--rollout-dtype fp8-router with its --router-levels, and the "
                  "start-matched warm-up) only when tier 1 is complete and that p is below 0.05 after Holm over the "
                  "five positions, with no replay collapsing more; otherwise the default stays as it is")
PREDICTIONS = (
    "At 4 mini-steps, no replay's collapse rate and drawdown grow with the dial and its kl rises during training; "
    "R3 stays stable at every position with its kl flat or falling.",
    "R2 is no better than no replay against the dial; the fp32 oracle is stable at 4 mini-steps.",
    "At 1 mini-step the gap is small (R3 may learn faster; nothing collapses).",
    "The deep preset at natural fp8-router flips >= 90 % of tokens and shows the same sign of effect as the dial at "
    "its token flip rate.")
