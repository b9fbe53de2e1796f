"""The staleness grid's design, each piece fixed before the runs it governs (its comment says when): the cells and
the flags of their runs, the pilot, the tests, the rules of the readings (their texts are printed with every result)
and the follow-up controls. The collapse rule is experiments/rules.py's RULE; analysis.py applies these rules to the
finished runs, grid.py runs the cells.
"""
import os

from experiments.sweep import HEADLINE, flag_value, set_flag, with_lr

ENGINES = {"fp8-router": ("none", "r2", "r3"), "fp32": ("none", "r2")}
MINI_STEPS = (1, 4, 8)
FRESH = 4  # n1fresh: prompts / 4, steps x 4
STEPS = 1000
SEEDS = tuple(range(8))
PILOT_LRS = (3e-4, 5e-4, 7e-4)
PILOT_SEEDS = (0, 1, 2, 3)
PILOT_CELLS = ("fp32/none/n4", "fp8-router/none/n4")


# Set from the pilot (results/staleness/pilot.md, commit 8922af9) before any grid run, by the rule above: at 3e-4
# fp8-router/none/n4 fell in 2 of 4 seeds (steps 249 and 999), at 5e-4 and 7e-4 in 0 of 4. At the higher lrs most
# runs never learned (best held-out <= 0.06 in 12 of 16), so there was nothing to fall from; 3e-4 is the headline's.
LR = 3e-4
CADENCES = {"--eval-every": 50, "--val-every": 25, "--fidelity-every": 0, "--mismatch-every": 1,  # r3/train/config.py's
            "--save-every": 50, "--dump-every": 50, "--lr-warmup": 10}                         # defaults
TESTS = [("fp8-router/none/n{N}", "fp8-router/r3/n{N}"), ("fp8-router/none/n{N}", "fp8-router/r2/n{N}"),
         ("fp8-router/r2/n{N}", "fp8-router/r3/n{N}"), ("fp32/none/n{N}", "fp32/r2/n{N}"),
         ("fp8-router/none/n{N}", "fp32/none/n{N}")]
# and, once: stale against fresh minibatches at N = 4's budget, and the two engines with fresh minibatches
MATCHED = [("fp32/none/n4", "fp32/none/n1fresh"), ("fp8-router/none/n4", "fp8-router/none/n1fresh"),
           ("fp8-router/none/n1fresh", "fp32/none/n1fresh")]


# Issue 19 asks that the grid's most separating setting become experiments.collapse's default. Which one that is,
# fixed at 30 of 120 runs (2026-12-03), before seeds 2-7 ran:
SELECTION_TEXT = ("the most separating setting is the mini-step count N whose fp8-router none vs r3 Fisher p on "
                  "sustained collapses is smallest (ties: the smaller drawdown permutation p, then the smaller N); "
                  "it becomes experiments.collapse's default only when the grid is complete and that p is below "
                  "0.05, reported with its direction (which arm collapsed more); otherwise the default stays as it "
                  "is and the README says that no setting separated the arms")


# Which of (a), (b), (c) the grid supports, fixed at 32 of 120 runs (2026-12-03), when every test read p = 1 and
# before seeds 2-7 of most cells ran. Each mechanism has the tests where it predicts a difference and the other does
# not, each with the arm it predicts collapses more first:
PRECISION_TESTS = [("fp8-router/none/n1", "fp32/none/n1"), ("fp8-router/none/n4", "fp32/none/n4"),
                   ("fp8-router/none/n8", "fp32/none/n8"), ("fp8-router/none/n1fresh", "fp32/none/n1fresh"),
                   ("fp8-router/none/n1", "fp8-router/r3/n1"), ("fp8-router/r2/n4", "fp8-router/r3/n4"),
                   ("fp8-router/r2/n8", "fp8-router/r3/n8")]
STALENESS_TESTS = [("fp32/none/n4", "fp32/r2/n4"), ("fp32/none/n8", "fp32/r2/n8"),
                   ("fp8-router/none/n4", "fp8-router/r2/n4"), ("fp8-router/none/n8", "fp8-router/r2/n8"),
                   ("fp32/none/n4", "fp32/none/n1fresh"), ("fp8-router/none/n4", "fp8-router/none/n1fresh")]
MECHANISM_TEXT = ("(a) precision is supported when one of its 7 tests (fp8-router/none vs fp32/none at N = 1, 4, 8 "
                  "and n1fresh; fp8-router/none vs r3 at N = 1; fp8-router/r2 vs r3 at N = 4, 8) has a Fisher p on "
                  "sustained collapse counts below 0.05 after Holm's correction over the 7, with the first arm "
                  "collapsing more; (b) staleness when one of its 6 tests (none vs r2 at N = 4, 8 under both "
                  "engines; none/n4 vs none/n1fresh under both) does, Holm over the 6, the first arm collapsing "
                  "more; both may hold; when neither does, (c). A test below 0.05 (Holm) the other way round is "
                  "reported as evidence against its mechanism. Decided only on the complete grid. Reported with "
                  "(b) (added at 39 of 120 runs; the verdict is unchanged): whether a replay test (none vs r2) "
                  "passed, or only the fresh-minibatch tests, which show staleness but not that it is the routing's")


# A hypothesis the first seeds raised, tested on seeds they do not include (fixed at 38 of 120 runs, 2026-12-03,
# before any run of seeds 3-7 in the two cells it compares): at N = 4 the fp8-router R3 runs climbed less than the
# R2 runs (best held-out 0.55, 0.67, 0.17 against 0.99, 1.00, 1.00 on seeds 0-2), so R3's lack of falls there may be
# a lack of height.
LEARN_SEEDS = (3, 4, 5, 6, 7)
LEARN_TEST = ("fp8-router/r3/n4", "fp8-router/r2/n4")
LEARN_FLOOR = 0.1
LEARN_TEXT = ("hypothesis from seeds 0-2, written before any run of seeds 3-7 in the two cells it compares: at N = 4 "
              "the fp8-router R3 runs climb less than the R2 runs. Test, on seeds 3-7 only: the exact permutation "
              "test on best held-out, fp8-router/r3/n4 against fp8-router/r2/n4, leaving out a seed on which neither "
              f"arm's best passed {LEARN_FLOOR} (neither run learned the task, as seed 3 did not in the pilot); "
              "confirmed when p < 0.05 with R3's mean the lower, not confirmed otherwise; decided once both cells "
              "have all five seeds. Shown beside it, not tested: the same comparison on every seed, at N = 8, and "
              "against no replay")


# Exploratory, from seeds 0-4, fixed at 69 of 120 runs (2026-12-04), before any run of seeds 5-7.
START_SEEDS = (5, 6, 7)
START_FLOOR = 0.2  # a start below this predicts no climb
START_CLIMB = 0.5  # climbing: a best held-out above this in some N >= 4 cell
START_TEXT = ("exploratory, written at 69 of 120 runs before any run of seeds 5-7: a seed's start is the reward of "
              "its runs' first step (after the seed's warm-up, before any update; the median over its finished "
              "runs). Seeds 0-4 suggested that a seed starting below 0.2 reaches a best held-out above 0.5 in none "
              "of its N = 4 and N = 8 cells (seeds 3 and 4 started at 0.10 and 0.14 and had reached at most 0.17), and "
              "a seed starting at 0.2 or more does in at least one (seeds 0-2 started at 0.26-0.44). Seeds 5-7 test "
              "it: it holds when each of them does as its start predicts, read once all ten of a seed's N >= 4 "
              "runs have finished")


# The two follow-up controls of docs/staleness.md ("What the grid cannot tell apart"), fixed at 46 of 120 runs
# (2026-12-03), before any run of them. Each is fp8-router/none/nN with one setting changed, at the N where the
# complete grid's no-replay cell fell most; neither is part of the grid's 120 runs.
CONTROL_ARMS = {"dense": (("--dense", None),),                                # the dense twin: no router, no routes
                "clip": (("--clip-low", "0.2"), ("--clip-high", "0.28"))}    # PPO's clip range back on
CONTROL_ENGINE = "fp8-router"
CONTROL_N_TEXT = ("the controls run at the mini-step count N in {4, 8} at which fp8-router/none had the most "
                  "sustained collapses in the complete grid (ties: N = 4, the cheaper), under the fp8-router engine, "
                  "seeds 0-7, every other flag the grid's")
CONTROL_TEXT = ("two tests at that N, Fisher's exact on sustained collapse counts, Holm over the 2, each with the "
                "arm predicted to collapse more first: routing, fp8-router/none/nN against fp8-router/dense/nN (the "
                "dense twin, --dense: the fp8 weights stay, the router goes, so no route can go stale or differ "
                "between engines); trust region, fp8-router/none/nN against fp8-router/clip/nN (--clip-low 0.2 "
                "--clip-high 0.28: a stale ratio can push only so far). A mechanism is supported when its test has "
                "Holm p < 0.05 with no replay collapsing more; the same the other way round is reported as the "
                "control collapsing more; both may hold; decided only when all three cells have seeds 0-7. Shown "
                "beside them, not tested: best held-out per cell (the dense twin is another model from another "
                "warm-up, so how high it climbs is not the MoE's) and each control against fp8-router/r2/nN")


def grid_cells() -> list[str]:
    cells = [f"{e}/{a}/n{n}" for n in MINI_STEPS for e, arms in ENGINES.items() for a in arms]
    return cells + ["fp32/none/n1fresh", "fp8-router/none/n1fresh"]


def alias(cell: str) -> str:
    """The cell whose runs this one uses: r2 at one mini-step is none (R2 replays the update's own routes)."""
    e, a, n = cell.split("/")
    return f"{e}/none/n1" if (a, n) == ("r2", "n1") else cell


def control_cells(n: int) -> list[str]:
    """The no-replay and R2 cells of the grid at N (reused from it), then the two controls."""
    return [f"{CONTROL_ENGINE}/{a}/n{n}" for a in ("none", "r2", *CONTROL_ARMS)]


def cell_run(cell: str, seed: int, lr: float, runs_dir: str, common: str = HEADLINE,
             steps: int = STEPS) -> tuple[str, list[str], int]:
    """(out_dir, train.py flags, steps) of one run of a (non-aliased) cell."""
    e, a, n = cell.split("/")
    flags = [*with_lr(common, lr).split(), "--replay", "none" if a in CONTROL_ARMS else a, "--rollout-dtype", e,
             "--seed", str(seed)]
    for name, value in CONTROL_ARMS.get(a, ()):  # a follow-up control: its no-replay cell, one setting changed
        flags = set_flag(flags, name, value) if value is not None else flags + [name]
    if n.endswith("fresh"):
        flags = set_flag(flags, "--prompts-per-step", str(int(flag_value(flags, "--prompts-per-step", "16")) // FRESH))
        for name, default in CADENCES.items():
            flags = set_flag(flags, name, str(int(flag_value(flags, name, str(default))) * FRESH))
        flags, steps = set_flag(flags, "--mini-steps", "1"), steps * FRESH
    else:
        flags = set_flag(flags, "--mini-steps", n[1:])
    return os.path.join(runs_dir, f"{e}-{a}-{n}-lr{lr:g}-s{seed}"), flags, steps
