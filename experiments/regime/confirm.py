"""Round 5's design (issue 49), fixed before any of its runs: the confirmation of R3's stability effect on fresh
seeds, and the comparison of the corrections stacks turn on instead of R3, at the regime grid's strongest setting.
Nothing here is measured; `confirm_run.py` runs it and writes its tables. Written 2026-12-07, before the first run.

Every run is a regime-grid run (design.COMMON, 800 steps, start-matched warm-up, `--eval-trainer`) whose flags are
those of grid.cell_run for its setting; the comparison's arms add one method's flags to `lv3-clip/none/n4`. Seeds 0-7
were the regime grid's exploration and are not part of any test here; seeds 8-31 are fresh (never run before).
"""
from experiments.regime import design

# --------------------------------------------------------------------------------------------- the confirmation
CONFIRM_SEEDS = tuple(range(8, 32))  # 24 fresh, start-matched seeds per cell
CONFIRM_SETTINGS = ("lv3-clip", "lv3")  # the clipped update real stacks use, and the grid's tier-1 update
CONFIRM_CELLS = tuple(f"{s}/{a}/n4" for s in CONFIRM_SETTINGS for a in ("none", "r3"))
STEPS = 800  # the regime grid's steps (results/regime/regime.json, the pilot's rule), unchanged
CONFIRM_RULE_TEXT = (
    "at each of the two settings (lv3-clip, lv3; 4 mini-steps), R3's stability effect is confirmed when no replay "
    "collapses more often than R3 (the regime grid's sustained-collapse rule, unchanged) and the two-sided Fisher "
    "exact p on the collapse counts, none against r3, is below 0.05 after Holm's correction over the two settings, on "
    "the fresh seeds 8-31 alone (24 per cell). Otherwise it is not confirmed at that setting, and the report says so "
    "as prominently")
CONFIRM_REPORT_TEXT = (
    "beside the rule, each with a 95 % interval: the collapse-rate difference (none - r3; Newcombe's hybrid score "
    "interval from two Wilson intervals), each arm's collapse rate (Wilson), the paired held-out area and largest "
    "drawdown (none - r3, t interval over seeds; paired sign-flip permutation p), the trainer's greedy held-out "
    "accuracy at the last evaluation (none - r3, paired), the runs that fell and came back (RECOVERED_TEXT), and the "
    "pooled 32-seed numbers (seeds 0-31: the grid's exploration with these) as secondary, never the test")
RECOVER_MARGIN = 0.1
RECOVERED_TEXT = (f"a run that fell by the rule came back when its held-out accuracy at the last evaluation is within "
                  f"{RECOVER_MARGIN} of its best before the fall (the best up to and including its collapse step)")

# ------------------------------------------------------------------------------------------------ the comparison
COMPARE_SEEDS = tuple(range(8, 24))  # 16 per arm; its none and r3 arms are the confirmation's lv3-clip runs there
COMPARE_SETTING = "lv3-clip"
IS_CAP = "2"  # C of token TIS, IcePop's band [1/C, C] and sequence MIS's band, one value for all (the flag's default)
# arm -> the flags it adds to lv3-clip/none/n4 (--replay none is the base). GSPO is its sequence-level loss with its
# own clip range (3e-4 / 4e-4, the GSPO paper's): lv3-clip sets 0.2 / 0.28 explicitly, so the arm sets GSPO's back;
# the clip range is part of the method, not a tuned knob.
ARMS = {
    "none": (),
    "tis": (("--is-correction", "tis"), ("--is-cap", IS_CAP)),
    "icepop": (("--is-correction", "icepop"), ("--is-cap", IS_CAP)),
    "mis": (("--is-correction", "mis"), ("--is-cap", IS_CAP)),
    "r2": (("--replay", "r2"),),
    "r3": (("--replay", "r3"),),
    "r3-tis": (("--replay", "r3"), ("--is-correction", "tis"), ("--is-cap", IS_CAP)),
    "gspo": (("--loss", "gspo"), ("--clip-low", "3e-4"), ("--clip-high", "4e-4")),
    "gspo-r3": (("--loss", "gspo"), ("--clip-low", "3e-4"), ("--clip-high", "4e-4"), ("--replay", "r3")),
}
COMPARE_TESTS_TEXT = (
    "each arm other than none and r3 against no replay (family A: does the method do better than nothing?) and "
    "against r3 (family B: is it worse than R3?), and r3 against none in family A: two-sided Fisher exact on "
    "sustained-collapse counts and paired sign-flip permutation tests on held-out area and largest drawdown (the "
    "arms of a seed share its warm-up and prompt stream), Holm within each family and metric. Per arm: collapse count "
    "with its Wilson 95 % interval, held-out area, largest drawdown, median largest pre-clip grad norm, mean kl and "
    "its trend, and the share of tokens (sequences for MIS) the correction truncated or masked, mean over steps")
PREDICTIONS = {
    "tis": "does not prevent the fall (the R3 paper: GRPO + TIS collapsed where R3 did not): about as many falls as "
           "no replay. TIS bounds a token's weight, not the gradient of the routes the trainer flips",
    "icepop": "fewer falls than no replay but not none: masking tokens whose ratio leaves [1/2, 2] drops the extreme "
              "ones that drive the gradient spikes, yet most flipped tokens sit inside the band and still carry a "
              "gradient for the wrong routes",
    "mis": "about as no replay: a geometric-mean sequence ratio rarely leaves [1/2, 2] at these lengths (about 30 "
           "tokens), so few sequences are dropped",
    "r2": "no better than no replay: the mismatch is the engine's, not staleness across mini-steps",
    "r3": "holds: no falls, or far fewer than no replay (the confirmation's claim)",
    "r3-tis": "holds, as R3",
    "gspo": "fewer falls than no replay: its tight sequence-level clip (3e-4 / 4e-4) stops most updates from a "
            "mismatched sequence; it learns more slowly (smaller held-out area early)",
    "gspo-r3": "holds, and learns at least as well as gspo alone",
}
CONFIRM_PREDICTION = ("no replay falls on about 40 % of fresh seeds at lv3-clip and 35 % at lv3 (the exploration's 4 "
                      "of 8 and 3 of 8), R3 on none; the rule confirms at both settings")


def confirm_runs() -> list[tuple[str, int]]:
    """(cell, seed) of the confirmation, seed-major so that a partial run is balanced across the four cells."""
    return [(c, s) for s in CONFIRM_SEEDS for c in CONFIRM_CELLS]


def compare_runs() -> list[tuple[str, int]]:
    """(cell, seed) of the comparison's own runs (its none and r3 arms are the confirmation's), seed-major."""
    return [(f"{COMPARE_SETTING}/{a}/n4", s) for s in COMPARE_SEEDS for a in ARMS if a not in ("none", "r3")]


assert design.STRONGEST == "lv3" and set(CONFIRM_SEEDS).isdisjoint(design.SEEDS)
