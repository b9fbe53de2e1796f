"""The levers' design (issue 50, parts 2 and 3), fixed before any of their measurements and any of their runs: where
the two levers real stacks pull put the toy in the regime table (asynchronous rollouts, `--rollout-lag K`; low-bit
rollout engines, `--rollout-dtype int4 | fp4`), and a pre-registered grid on them. Nothing here is measured;
`levers_measure.py` makes the rows, `levers_report.py` writes them, `levers_run.py` plans and runs the grid.
Written 2026-12-07, before the first lever measurement and the first lever run.

The rows are measurements that sit beside the regime table's rows (design.py), not tests: they use the regime
table's seeds 0-7, its start-matched warm-ups (`--warmup-until 0.3`, at most 400 steps), its probe batch (64 prompts
x 8 samples, seed 424242) and its runs' flags (design.COMMON, 4 mini-steps, no replay), so a lever's row and the
dial's rows differ in the lever alone. No test reads a row; the grid's rules read two of them (the lag choice, the
fallback). The grid is a test: it runs fresh seeds (GRID_SEEDS).
"""
from experiments.regime import confirm, design

# ----------------------------------------------------------------------------------------- the low-bit rows
# int4 (groups of 128, a/7) and fp4 (NVFP4: e2m1 in groups of 16, e4m3 scales) quantise the engine's matmul weights
# (attention, experts, lm_head) and keep its router bf16 (r3/model/quant.py): routes move only through the hidden
# states. On the toy (the reference: the regime table's model) and on qwen3-ratio (Qwen3-30B-A3B's routing shape at
# toy width: top-8 of 64 small experts, 6 layers), where results/mismatch_precisions (sort, a fixed 200-step warm-up)
# saw int4 / fp4 flip ~79 % / 76 % of tokens and ~26 % / 23 % of routers.
LOWBIT_DTYPES = ("int4", "fp4")
LOWBIT_PRESETS = ("qwen3-ratio", "toy")
LOWBIT_ROWS = {f"{p}-{d}": (p, d) for p in LOWBIT_PRESETS for d in LOWBIT_DTYPES}  # row -> (preset, dtype)
LOWBIT_TEXT = ("per low-bit row, as the regime table measures the dial: at the start of RL, each seed's start-matched "
               "warm-up (its `reached` recorded: did the sampled probe reward reach 0.3 within 400 steps?) sampled "
               "on the probe batch by the row's engine and scored by the fp32 trainer without and with R3 (router "
               "and token flips, flips per token, |log r| quantiles, F(2), kl, kl with R3, length, entropy, "
               "S = length x kl, sampled reward); after 200 steps, the same of the policy at step 200 of the row's "
               "no-replay 4-mini-step run (design.COMMON + --preset P --rollout-dtype D), from its ckpt.pt")

# --------------------------------------------------------------------------------------------- the lag rows
# At the natural fp8-router engine on the toy (the dial's `natural` setting). The lag does nothing before the first
# update, so its row is measured over training, not at the start.
LAGS = (1, 2, 4, 8)
LAG_ROWS = {f"lag{k}": k for k in LAGS}
LAG_STEPS = 200  # a row's run: steps 0-199; its ckpt.pt at the end holds step 200's start (the probe's policy)
LAG_WINDOW = (50, 190)  # steps, both ends included: the 15 readings (--mismatch-every 10) a 200-step run logs from 50
LAG_BASE_CELL = "natural/none/n4"  # K = 0: the regime grid's committed records, seeds 0-7, steps 0-799 (not rerun)
LAG_TEXT = (
    "per lag row (K = 1, 2, 4, 8; the natural fp8-router engine on the toy), from a no-replay 4-mini-step run of "
    f"{LAG_STEPS} steps with the regime grid's flags (design.COMMON, --rollout-dtype fp8-router) and --rollout-lag K: "
    "the router and token flip rates, flips per token, kl (no replay; the trainer's own forward against the stale "
    f"engine's log-probs), response length and S = length x kl, as the run logs them every 10 steps over steps "
    f"{LAG_WINDOW[0]}-{LAG_WINDOW[1]} (15 readings), the mean per run; then the mean and 95 % t interval over seeds "
    "0-7. K = 0 is the same window of the regime grid's natural/none/n4 runs (their committed records: the same flags "
    "without --rollout-lag), so the table says how much of the flip rate is the lag")
LAG_KL_R3_TEXT = (
    "kl with replay, for a lag row: the probe re-score at step 200. The run's ckpt.pt at its end holds the trainer's "
    "weights at step 200's start and the lagged engine (the weights of step 200 - K, cast as the engine casts them, "
    "which is what samples step 200); the engine samples the regime probe batch and the trainer scores it without and "
    "with R3 (measure.py's measure, the engine restored from the checkpoint): kl and kl with R3 on the same batch, "
    "with the flips. K = 0's is the regime table's `after 200 steps` measurement of natural (results/regime/measure/"
    "after-natural-sS.json: the same probe at step 200 of the same runs). Chosen over R3 runs with the lag because it "
    "is the same batch and the same policy as the no-replay kl beside it (an R3 run's kl is of another trajectory) "
    "and costs one probe per run, not a second run; it reads one step, not the window, and says so")

# ------------------------------------------------------------------------------------------------- the grid
GRID_SEEDS = tuple(range(32, 40))  # fresh: 0-7 explored the dial (and make the rows), 8-31 are round 5's
EXTRA_SEEDS = tuple(range(40, 48))  # a setting that separates (EXTEND_TEXT) runs these too: 16 seeds
STEPS = 800  # the regime grid's steps (its pilot's rule), unchanged
IS_CAP = confirm.IS_CAP  # C of TIS, round 5's; pinned in every grid run (it does nothing without --is-correction)
ARMS = {"none": (), "r3": (("--replay", "r3"),), "tis": (("--is-correction", "tis"),),
        "r3-tis": (("--replay", "r3"), ("--is-correction", "tis"))}
LAG_ARMS = ("none", "r3", "tis")
LOWBIT_ARMS = ("none", "r3", "tis", "r3-tis")
GRID_DTYPE = "int4"
UPDATE_TEXT = (
    "every grid run uses the clipped update of lv3-clip (design.CLIP_FLAGS: PPO clip 0.2 / 0.28, gradient clip 1.0, "
    "the trainer's log-probs as π_old), on design.COMMON, 4 mini-steps, 800 steps, with --is-cap 2. Why: it is what "
    "the asynchronous stacks run (verl's one-step-off-policy trainer and AReaL recompute π_old with the trainer and "
    "clip; docs/async.md), TIS is defined only with the trainer's π_old (its weight π_old / π_engine is 1 otherwise; "
    "train.py refuses it), and one update for all arms keeps each arm one flag from its base (none -> r3: --replay; "
    "none -> tis: --is-correction; r3 -> r3-tis and tis -> r3-tis: the other one)")
LAG_RULE_TEXT = (
    "the lag cells run at K = 1 and at K*, the K of 1, 2, 4, 8 whose lag row's token flip rate (mean over seeds 0-7, "
    f"steps {LAG_WINDOW[0]}-{LAG_WINDOW[1]}) is nearest lv3's over the same steps of the regime grid's lv3/none/n4 "
    "runs (their committed records, seeds 0-7: the same quantity, logged the same way; ties: the smaller K); "
    "K* = 1 leaves one lag setting. Decided only when all four lag rows have all eight seeds")
FALLBACK_MARGIN = 0.1
FALLBACK_TEXT = (
    "the int4 cells run on qwen3-ratio when (a) its start-matched warm-up reached the target (sampled probe reward "
    "0.3 within 400 steps) on every one of seeds 0-7 (the qwen3-ratio-int4 start measurements record it) and (b) its "
    f"int4 row's sampled reward after 200 steps (mean, seeds 0-7) is at least {FALLBACK_MARGIN} above the row's at "
    "the start (it learns the cipher under RL; the toy's natural row goes 0.32 -> 0.93); otherwise they run on the toy "
    "with an int4 engine, and the report says which and why. Decided only when both rows have all eight seeds")
EXTEND_TEXT = (
    "after seeds 32-39 of every cell of a setting, the setting's cells also run seeds 40-47 when one of its tested "
    "pairs separates: collapse counts that differ by 2 or more (of 8), or a paired held-out-area permutation p below "
    "0.1 (uncorrected). Its tests then read all 16 seeds; the look at 8 is an interim one, and the report says that "
    "its p values are not adjusted for it")
TESTS_TEXT = (
    "the collapse rule and per-run numbers of the regime grid (design.RULE_TEXT, experiments.rules' sustained "
    "collapse, unchanged). Family A (does R3 hold?): none vs r3 at each grid setting (up to three: lag 1, lag K*, "
    "int4), two-sided Fisher exact on collapse counts, Holm over the settings; paired sign-flip permutation tests "
    "(the arms of a seed share its warm-up and prompt stream) on held-out area and largest drawdown, Holm over the "
    "settings per metric. Family B (the correction stacks use instead): none vs tis and tis vs r3 at each setting, "
    "and at int4 r3 vs r3-tis and none vs r3-tis, the same three tests, Holm within the family and metric. R3 holds "
    "at a setting when its Holm-adjusted Fisher p is below 0.05 and no replay collapses more")

# ----------------------------------------------------------------------------------------------- predictions
ROW_PREDICTIONS = (
    "qwen3-ratio's start-matched warm-up reaches 0.3 on all eight seeds within 400 steps (6 layers; the 4-layer toy "
    "takes 48-69 steps; the 24-layer deep shape missed at 400), and its int4 row learns the cipher (after-200 reward "
    "> 0.8): the fallback is not taken.",
    "At the start of RL, int4 / fp4 on qwen3-ratio flip 70-85 % of tokens and 20-30 % of routers (the paper: 94 % / "
    "10 %: fewer flips per token, 1-2 against 6, in 6 layers against 48), kl 3e-3-6e-3 and R3 removes less than half "
    "of it (kl with R3 / kl > 0.5: the engine's experts and attention are low-bit too); S = length x kl < 0.3, "
    "far below the published collapses' 3-30. On the toy, 10-20 % of tokens and 3-6 % of routers.",
    "After 200 steps the low-bit flip rates stay within a few points of the start's and kl falls (entropy falls), as "
    "the dial's rows did.",
    "Lag: the token and router flip rates and kl grow with K, from natural's 8.4 % of tokens at K = 0 (steps "
    "50-190), each K above the one before; kl with R3 / kl rises toward 1 with K (the lag's mismatch is a weight "
    "change, not a rounding of the router: replaying the stale routes removes a smaller share of it than of the "
    "precision mismatch).",
    "No lag up to 8 reaches lv3's 82 % of tokens; the rule picks K* = 8.")
GRID_PREDICTIONS = {
    "lag1": "nothing separates: 0-1 falls of 8 in each arm (one step of staleness at lr 3e-4 is a small mismatch)",
    "lagK": "no replay falls on fewer seeds than lv3-clip's 4 of 8 (1-3); R3 does not separate from no replay (it "
            "replays the stale routes, but most of the lag's mismatch is not routing); TIS falls least (it weighs by "
            "π_old / π_engine, which carries the staleness)",
    "int4": "no replay falls on 2-4 of 8; R3 on fewer (0-2); TIS about as no replay (the R3 paper's GRPO + TIS); "
            "r3-tis fewest; at 8 seeds no Holm-adjusted p is below 0.05, and the extension rule runs seeds 40-47",
}


def lag_cells(k_star: int) -> list[str]:
    """The lag cells given K* (LAG_RULE_TEXT): K = 1 and K*, arms none / r3 / tis."""
    return [f"lag{k}-clip/{a}/n4" for k in sorted({1, k_star}) for a in LAG_ARMS]


def lowbit_cells(preset: str) -> list[str]:
    """The int4 cells on `preset` (FALLBACK_TEXT decides which): arms none / r3 / tis / r3-tis."""
    return [f"{preset}-{GRID_DTYPE}-clip/{a}/n4" for a in LOWBIT_ARMS]


def grid_cells(k_star: int, preset: str) -> list[str]:
    return lag_cells(k_star) + lowbit_cells(preset)


assert set(GRID_SEEDS + EXTRA_SEEDS).isdisjoint(design.SEEDS + confirm.CONFIRM_SEEDS)
assert design.ENGINE == "fp8-router" and design.POSITIONS["natural"] is None
