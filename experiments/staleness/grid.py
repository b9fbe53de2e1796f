"""Routing staleness or precision mismatch? A pre-registered grid over engine x replay x mini-steps, 8 seeds.

  python -m experiments.staleness --pilot      # first: fp32/none/n4 and fp8-router/none/n4, 4 seeds, PILOT_LRS
  python -m experiments.staleness              # the grid at LR (set below from the pilot), resumable, --jobs 2
  python -m experiments.staleness --report     # tables and figure from the runs finished so far (marked partial)
  python -m experiments.staleness --controls   # after the grid: the dense-twin and PPO-clipping controls at its N

Two factors enter every PPO ratio at mini-step k of a batch the engine μ sampled: π_θk/π_old (staleness: the policy,
and its routing, moved during the batch's earlier mini-steps) times π_old/μ (precision: same weights, other
numerics and other routes). The fp32 engine removes the second factor, one mini-step the first; R2 freezes the
routing of the first, R3 of both. Cells ENGINE/ARM/nN, every other flag experiments.collapse's HEADLINE at --lr LR:
  fp8-router/{none, r2, r3}/n{1, 4, 8}   the mismatched engine
  fp32/{none, r2}/n{1, 4, 8}             the oracle engine (no precision mismatch; R3 would equal R2 there)
  at N = 1, R2 is the identity (the update is the old-policy pass, so its routes are the router's own), and the
  r2/n1 cells alias the none/n1 runs;
  fp32/none/n1fresh, fp8-router/none/n1fresh: one mini-step with a quarter of the prompts per step and four times
  the steps: N = 4's minibatch, samples seen and optimizer steps, each minibatch sampled by the current policy
  (--lr-warmup and every logging cadence scaled by 4, and their metrics read in blocks of 4 steps, so that every
  cell is measured at the same sample counts).
Neighbouring cells differ in one flag: --replay, --rollout-dtype or --mini-steps.

The rule (RULE, fixed before any run and printed with every result). Primary, a *sustained* collapse, at the first
step where: held-out accuracy (eval/accuracy, sampled) is >= 0.3 below its best so far at two consecutive
evaluations (the step of the first), or at the run's last evaluation; or the reward EMA (0.9) is >= 0.3 below its
running peak (taken after step 5) for 50 consecutive steps (the first of them); or the loss or grad norm is not
finite. Secondary: experiments.collapse's RULE (any single dip), so the older tables stay comparable.
max_drawdown = the largest fall of held-out accuracy below its best so far.

Tests (TESTS), at each N: Fisher's exact test on primary collapse counts and an exact permutation test on
max_drawdown, for fp8-router none vs r3, none vs r2, r2 vs r3; fp32 none vs r2; fp8-router none vs fp32 none.
Pre-registered predictions (GSPO 2507.18071, Zheng et al. 2512.01374, RSPO 2510.23027), to confirm or refute:
  (b) staleness: at N >= 4 fp32/none collapses about as often as fp8-router/none; r2 and r3 are stable under both
      engines; nothing collapses at N = 1 (n1fresh included);
  (a) precision: fp8-router/none collapses more often than fp32/none at every N; fp8-router/r2 is no better than
      none; r3 is stable.
  (c) neither: no difference the tests can see.
Which of them the grid supports is read off the tests by MECHANISM_TEXT (fixed at 32 of 120 runs): each mechanism's
discriminating Fisher tests, Holm-corrected within the family.

The pilot (2 cells x PILOT_LRS x 4 seeds) chooses LR by a rule fixed before it ran: the pilot lr whose
fp8-router/none/n4 primary collapse count is closest to 2 of 4 (ties: the lower lr). Writes OUT/pilot.{md,json}.
The grid writes OUT/grid.{json,md,png}: `cells` keyed ENGINE/ARM/nN, each with `collapsed` and `runs` (seed ->
collapse_step, why, max_drawdown, best_heldout, final_heldout, max_grad_norm, mean_kl, ...), and `tests`.
Runs live in OUT/runs, the pilot's too: a pilot run at the chosen lr is the grid's run of that cell and seed (same
flags, same folder), so the grid reuses it. Finished runs whose flags match are reused, partial ones resumed.
The follow-up controls (CONTROL_ARMS, --controls; not part of the grid's 120 runs) change one setting of
fp8-router/none/nN at the N the complete grid picks (CONTROL_N_TEXT): `dense` (the dense twin: no router, so no
routing to go stale) and `clip` (PPO's clip range back on); CONTROL_TEXT reads them. Writes OUT/controls.{json,md,png}.
Each finished run leaves a record in OUT/records (experiments/sweep.py), committed with the tables, which are made
from the records alone: a fresh clone resumes the grid and `--report` remakes the tables without the run folders.
"""
import argparse
import json
import math
import os
import statistics
import textwrap
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker
import matplotlib.lines

from experiments.collapse.protocol import HEADLINE, collapse_step, with_lr
from experiments.common import fmt, write_results
from experiments.stats import fisher_exact, permutation_test
from experiments.sweep import finished, run_all

RULE = dict(heldout_drop=0.3, heldout_consecutive=2, reward_ema_decay=0.9, reward_drop=0.3, reward_steps=50,
            peak_after_steps=5, nonfinite=True)
RULE_TEXT = ("sustained collapse = first step where held-out accuracy <= its best so far - 0.3 at two consecutive "
             "evaluations (or at the last one), or reward EMA(0.9) <= its running peak (after step 5) - 0.3 for 50 "
             "consecutive steps, or loss / grad norm non-finite; secondary: experiments.collapse's RULE (any dip)")
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
CADENCES = {"--eval-every": 50, "--val-every": 25, "--fidelity-every": 0, "--mismatch-every": 1,  # r3/config.py's
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


def most_separating(ts: list[dict]) -> dict | None:
    """SELECTION_TEXT on the grid's tests: {N, p, p_drawdown, counts, direction, separates} or None (no tests)."""
    by_n = {}
    for t in ts:
        a, b = t["a"].split("/"), t["b"].split("/")
        if a[:2] == ["fp8-router", "none"] and b[:2] == ["fp8-router", "r3"] and a[2] == b[2] and \
                a[2][1:].isdigit():
            by_n.setdefault(int(a[2][1:]), {})[t["metric"]] = t
    if not by_n:
        return None
    n = min(by_n, key=lambda k: (by_n[k]["collapsed"]["p"], by_n[k]["max_drawdown"]["p"], k))
    c, d = by_n[n]["collapsed"], by_n[n]["max_drawdown"]
    direction = ("no replay collapsed more" if c["effect"] > 0 else "R3 collapsed more" if c["effect"] < 0
                 else "equal collapse counts")
    return dict(N=n, p=c["p"], p_drawdown=d["p"], counts=c["counts"], direction=direction, separates=c["p"] < 0.05)


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


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the order given."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, run = [1.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = run
    return adj


def mechanism(ts: list[dict], complete: bool) -> dict:
    """MECHANISM_TEXT on the grid's tests: per mechanism its tests with Holm-adjusted p, supported / against; and the
    verdict, (a), (b), (a) and (b), or (c) (None while the grid is partial or a test is missing)."""
    fisher = {(t["a"], t["b"]): t for t in ts if t["metric"] == "collapsed"}
    out, missing = {}, False
    for key, pairs in (("a", PRECISION_TESTS), ("b", STALENESS_TESTS)):
        found = [(a, b, fisher.get((a, b))) for a, b in pairs]
        missing |= any(t is None for _, _, t in found)
        have = [(a, b, t) for a, b, t in found if t is not None]
        adj = holm([t["p"] for _, _, t in have])
        rows = [dict(a=a, b=b, counts=t["counts"], p=t["p"], p_holm=q, effect=t["effect"])
                for (a, b, t), q in zip(have, adj)]
        out[key] = dict(tests=rows, supported=any(r["p_holm"] < 0.05 and r["effect"] > 0 for r in rows),
                        against=any(r["p_holm"] < 0.05 and r["effect"] < 0 for r in rows))
    # (b) from a replay test (none vs r2) says routing; from the fresh-minibatch tests alone, staleness in general
    out["b"]["by_replay"] = any(r["p_holm"] < 0.05 and r["effect"] > 0 and r["b"].split("/")[1] == "r2"
                                for r in out["b"]["tests"])
    sa, sb = out["a"]["supported"], out["b"]["supported"]
    verdict = "(a) and (b)" if sa and sb else "(a)" if sa else "(b)" if sb else "(c)"
    return dict(precision=out["a"], staleness=out["b"], verdict=verdict if complete and not missing else None,
                provisional=verdict)


def mechanism_table(m: dict) -> str:
    lines = ["| mechanism | predicts more collapses in | than in | collapsed | Fisher p | Holm p |",
             "|---|---|---|---|---|---|"]
    for name in ("precision", "staleness"):
        lines += [f"| {name} | {r['a']} | {r['b']} | {r['counts']} | {r['p']:.3g} | {r['p_holm']:.3g} |"
                  for r in m[name]["tests"]]
    return "\n".join(lines)


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


def learning(cells: dict) -> dict:
    """LEARN_TEXT on the grid's cells: the test on LEARN_SEEDS, and the descriptive comparisons beside it."""
    def runs(c: str) -> dict:
        return {int(s): r for s, r in cells.get(c, {}).get("runs", {}).items()}  # grid.json's seed keys are str

    def best(c: str, seeds=None) -> list[float]:
        return [r["best_heldout"] for s, r in sorted(runs(c).items())
                if r["best_heldout"] is not None and (seeds is None or s in seeds)]

    def compare(a: str, b: str, seeds=None) -> dict:
        xa, xb = best(a, seeds), best(b, seeds)
        return dict(a=a, b=b, a_best=xa, b_best=xb, effect=_mean(xa) - _mean(xb) if xa and xb else None,
                    p=permutation_test(xa, xb))
    a, b = (runs(c) for c in LEARN_TEST)
    finished = [s for s in LEARN_SEEDS if s in a and s in b]
    kept = [s for s in finished if max(a[s]["best_heldout"] or 0, b[s]["best_heldout"] or 0) > LEARN_FLOOR]
    test = dict(compare(*LEARN_TEST, kept), seeds=kept, left_out=[s for s in finished if s not in kept])
    decided = len(finished) == len(LEARN_SEEDS)
    test["confirmed"] = (test["p"] < 0.05 and test["effect"] < 0) if decided else None
    shown = [compare(*LEARN_TEST), compare("fp8-router/r3/n4", "fp8-router/none/n4"),
             compare("fp8-router/r3/n8", "fp8-router/r2/n8"), compare("fp8-router/r3/n8", "fp8-router/none/n8")]
    return dict(test=test, shown=shown)


def learning_table(m: dict) -> str:
    lines = ["| comparison | seeds | best held-out, a | best held-out, b | mean a - b | permutation p |",
             "|---|---|---|---|---|---|"]
    t = m["test"]
    kept = f"{', '.join(map(str, t['seeds'])) or '—'} (the test" + (
        f"; left out: {', '.join(map(str, t['left_out']))})" if t["left_out"] else ")")
    for r, seeds in [(t, kept)] + [(r, "descriptive: every finished seed, 0-2 included") for r in m["shown"]]:
        lines.append(f"| {r['a']} vs {r['b']} | {seeds} | {', '.join(fmt(x) for x in r['a_best']) or '—'} | "
                     f"{', '.join(fmt(x) for x in r['b_best']) or '—'} | {fmt(r['effect'])} | {r['p']:.3g} |")
    return "\n".join(lines)


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


def start(cells: dict, seeds=SEEDS) -> dict:
    """START_TEXT on the grid's cells: per seed its start, its best held-out at N >= 4, and whether it fits."""
    rows = []
    for seed in seeds:
        runs = {c: d["runs"][str(seed)] if str(seed) in d["runs"] else d["runs"].get(seed)
                for c, d in cells.items() if not d.get("alias_of")}
        runs = {c: r for c, r in runs.items() if r is not None}
        firsts = [r["first_reward"] for r in runs.values() if r.get("first_reward") is not None]
        if not firsts:
            continue
        high = [c for c in runs if c.split("/")[2] in ("n4", "n8")]
        best = max((runs[c]["best_heldout"] or 0 for c in high), default=None)
        first = statistics.median(firsts)
        complete = len(high) == sum(c.split("/")[2] in ("n4", "n8") for c, d in cells.items()
                                    if not d.get("alias_of"))
        fits = None if best is None or not complete else (first < START_FLOOR) == (best <= START_CLIMB)
        rows.append(dict(seed=seed, start=first, runs=len(firsts), best_n4_n8=best, n4_n8_runs=len(high),
                         complete=complete, fits=fits, tested=seed in START_SEEDS))
    tested = [r for r in rows if r["tested"]]
    decided = len(tested) == len(START_SEEDS) and all(r["complete"] for r in tested)
    return dict(seeds=rows, holds=all(r["fits"] for r in tested) if decided else None)


def start_table(m: dict) -> str:
    lines = ["| seed | start (first-step reward, median) | runs | predicts | best held-out at N = 4, 8 (runs) | "
             "fits |", "|---|---|---|---|---|---|"]
    for r in m["seeds"]:
        fits = "—" if r["fits"] is None else "yes" if r["fits"] else "**no**"
        lines.append(f"| {r['seed']}{'' if r['tested'] else ' (gave the idea)'} | {fmt(r['start'])} | {r['runs']} | "
                     f"{'no climb' if r['start'] < START_FLOOR else 'a climb'} | {fmt(r['best_n4_n8'])} "
                     f"({r['n4_n8_runs']}) | {fits} |")
    return "\n".join(lines)


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


def control_n(grid_json: dict) -> int:
    """CONTROL_N_TEXT on a complete grid.json."""
    falls = {n: grid_json["cells"][f"{CONTROL_ENGINE}/none/n{n}"]["collapsed"] for n in (4, 8)}
    return max(falls, key=lambda n: (falls[n], -n))


def control_cells(n: int) -> list[str]:
    """The no-replay and R2 cells of the grid at N (reused from it), then the two controls."""
    return [f"{CONTROL_ENGINE}/{a}/n{n}" for a in ("none", "r2", *CONTROL_ARMS)]


def control_verdict(cells: dict, n: int, seeds, probe: bool = False) -> dict:
    """CONTROL_TEXT on the cells at N: both tests, each with its Holm p (over the 2 always: a test whose cells have no
    runs yet reads p = 1) and reading; `decided` once every cell has `seeds`, never for a probe (other seeds, lr,
    steps, flags or an N not the rule's)."""
    base = f"{CONTROL_ENGINE}/none/n{n}"
    rows = []
    none = dict(collapsed=0, n=0)
    for arm in CONTROL_ARMS:
        a, b = cells.get(base, none), cells.get(f"{CONTROL_ENGINE}/{arm}/n{n}", none)
        have = a["n"] and b["n"]
        rows.append(dict(arm=arm, a=base, b=f"{CONTROL_ENGINE}/{arm}/n{n}",
                         counts=f"{a['collapsed']}/{a['n']} vs {b['collapsed']}/{b['n']}",
                         p=fisher_exact(a["collapsed"], a["n"], b["collapsed"], b["n"]) if have else 1.0,
                         effect=a["collapsed"] / a["n"] - b["collapsed"] / b["n"] if have else None))
    out = {}
    for r, q in zip(rows, holm([r["p"] for r in rows])):
        arm = r.pop("arm")
        reading = ("no runs yet" if r["effect"] is None else
                   "supported: no replay collapsed more" if q < 0.05 and r["effect"] > 0 else
                   f"the {arm} control collapsed more" if q < 0.05 and r["effect"] < 0 else "not shown")
        out[{"dense": "routing", "clip": "trust region"}[arm]] = dict(r, p_holm=q, reading=reading)
    finished = all(cells.get(c, {}).get("n") == len(seeds) for c in (base, *control_cells(n)[2:]))
    return dict(tests=out, decided=finished and not probe, probe=probe)


def grid_cells() -> list[str]:
    cells = [f"{e}/{a}/n{n}" for n in MINI_STEPS for e, arms in ENGINES.items() for a in arms]
    return cells + ["fp32/none/n1fresh", "fp8-router/none/n1fresh"]


def alias(cell: str) -> str:
    """The cell whose runs this one uses: r2 at one mini-step is none (R2 replays the update's own routes)."""
    e, a, n = cell.split("/")
    return f"{e}/none/n1" if (a, n) == ("r2", "n1") else cell


def flag_value(flags: list[str], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else default


def set_flag(flags: list[str], name: str, value: str) -> list[str]:
    out = list(flags)
    if name in out:
        out[out.index(name) + 1] = value
    else:
        out += [name, value]
    return out


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


def blocks(rows: list[dict], k: int) -> list[dict]:
    """k consecutive steps as one (n1fresh: the samples of one N = 4 step): mean reward, the last held-out
    evaluation, the largest grad norm (a non-finite one if any), the sum of losses; step = the block's index. A
    run that stopped early keeps its last, shorter block, so the step that stopped it is still read."""
    if k == 1:
        return rows
    out = []
    for i in range(0, len(rows), k):
        b = rows[i:i + k]
        evals = [r for r in b if r.get("eval/accuracy") is not None]
        norms = [r["grad_norm"] for r in b]
        out.append(dict(step=i // k, reward=sum(r["reward"] for r in b) / len(b), loss=sum(r["loss"] for r in b),
                        grad_norm=next((g for g in norms if not math.isfinite(g)), max(norms)),
                        kl=_mean([r.get("kl") for r in b]),
                        **({"eval/accuracy": evals[-1]["eval/accuracy"]} if evals else {})))
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None and x == x]
    return sum(xs) / len(xs) if xs else None


def sustained_collapse(rows: list[dict], acc: str = "eval/accuracy",
                       relative: float | None = None, floor: float = 0.1) -> tuple[int | None, str | None]:
    """RULE (primary) on one run's metrics rows: (first collapsed step, why) or (None, None). Each criterion gives
    its first step; the earliest wins. `acc`: the held-out metric (experiments/length.py: eval/reward).
    `relative` (experiments/length.py's secondary rule): a fall to at most (1 - relative) x the best held-out value
    or the peak reward EMA, counted only once that best or peak is at least `floor`, instead of 0.3 below it."""
    found = []
    bad = [r["step"] for r in rows if not all(math.isfinite(r[k]) for k in ("loss", "grad_norm"))]
    if RULE["nonfinite"] and bad:
        found.append((bad[0], "nonfinite"))

    def fell(value: float, top: float, drop: float) -> bool:
        if relative is None:
            return value <= top - drop
        return top >= floor and value <= (1 - relative) * top

    ema, peak, low_since = None, -math.inf, None
    for i, r in enumerate(rows):
        d = RULE["reward_ema_decay"]
        ema = r["reward"] if ema is None else d * ema + (1 - d) * r["reward"]
        if i < RULE["peak_after_steps"]:
            continue
        peak = max(peak, ema)
        low_since = (r["step"] if low_since is None else low_since) if fell(ema, peak, RULE["reward_drop"]) else None
        if low_since is not None and r["step"] - low_since + 1 >= RULE["reward_steps"]:
            found.append((low_since, "reward_drop"))
            break
    evals = [(r["step"], r[acc]) for r in rows if r.get(acc) is not None]
    best, streak = -math.inf, []
    for j, (step, a) in enumerate(evals):
        best = max(best, a)
        streak = streak + [step] if fell(a, best, RULE["heldout_drop"]) else []
        if len(streak) >= RULE["heldout_consecutive"] or (streak and j == len(evals) - 1):
            found.append((streak[0], "heldout_drop"))
            break
    return min(found) if found else (None, None)


def max_drawdown(rows: list[dict], acc: str = "eval/accuracy") -> float | None:
    accs = [r[acc] for r in rows if r.get(acc) is not None]
    best, dd = -math.inf, 0.0
    for a in accs:
        best = max(best, a)
        dd = max(dd, best - a)
    return dd if accs else None


def run_summary(commit: str | None, rows: list[dict], k: int = 1, acc: str = "eval/accuracy") -> dict:
    """One run's row of the tables, from its metrics rows (k: the block size, n1fresh 4) and the commit it ran at."""
    b = blocks(rows, k)
    step, why = sustained_collapse(b, acc)
    step2, why2 = collapse_step(b) if acc == "eval/accuracy" else (None, None)
    accs = [r[acc] for r in b if r.get(acc) is not None]
    finite = [r["grad_norm"] for r in rows if math.isfinite(r["grad_norm"])]
    return dict(collapse_step=step, why=why, secondary_step=step2, secondary_why=why2,
                max_drawdown=max_drawdown(b, acc),
                best_heldout=max(accs, default=None), final_heldout=accs[-1] if accs else None,
                max_grad_norm=max(finite, default=None), mean_kl=_mean([r.get("kl") for r in rows]),
                mean_staleness_flips=_mean([r.get("staleness/router_flip_rate") for r in rows]),
                mean_engine_flips=_mean([r.get("router_flip_rate") for r in rows]),
                max_abs_log_ratio=max((r["grpo/max_abs_log_ratio"] for r in rows if "grpo/max_abs_log_ratio" in r),
                                      default=None), steps=len(b), commit=commit[:10] if commit else None,
                first_reward=rows[0].get("reward") if rows else None)


def sweep(args, cells: list[str], seeds, lr: float, runs_dir: str) -> dict:
    """Run (or, without `launch`, only read) every (cell, seed), seed-major so a partial grid is balanced.
    Returns {cell: {seed: (commit, rows, block size, samples per step)}} for finished runs, read from their
    records (OUT/records, committed; experiments/sweep.py), so a fresh clone resumes and reports the grid."""
    records = args.records or os.path.join(os.path.dirname(runs_dir), "records")
    plan = [(c, s, *cell_run(c, s, lr, runs_dir, args.common, args.steps)) for s in seeds for c in cells
            if alias(c) == c]
    if not args.report:
        from experiments.staleness.plateaus import keep_input  # plateaus imports this module: not at the top
        grid = os.path.dirname(runs_dir)
        run_all([(out, flags, steps) for _, _, out, flags, steps in plan], jobs=args.jobs,
                log_dir=os.path.join(runs_dir, "logs"), records=records, on_finish=lambda out: keep_input(grid, out))
    done = {}
    for c, s, out, flags, steps in plan:
        if (rec := finished(out, flags, steps, records)) is not None:
            samples = int(flag_value(flags, "--prompts-per-step", "16")) * int(flag_value(flags, "--group-size", "8"))
            done.setdefault(c, {})[s] = (rec[0]["commit"], rec[1], FRESH if c.endswith("fresh") else 1, samples)
    for c in cells:  # aliased cells read their twin's runs
        if alias(c) != c and alias(c) in done:
            done[c] = done[alias(c)]
    return done


def cell_summary(runs: dict, alias_of: str | None = None) -> dict:
    """A cell's entry in grid.json from its per-seed run summaries: the collapse counts, and the runs."""
    return dict(collapsed=sum(r["collapse_step"] is not None for r in runs.values()), n=len(runs),
                secondary_collapsed=sum(r["secondary_step"] is not None for r in runs.values()), alias_of=alias_of,
                runs=runs)


def summarize(done: dict, cells: list[str]) -> dict:
    return {c: cell_summary({s: run_summary(o, rows, k) for s, (o, rows, k, _) in sorted(done.get(c, {}).items())},
                            None if alias(c) == c else alias(c)) for c in cells}


def tests(cells: dict) -> list[dict]:
    return pair_tests(cells, [(a.format(N=n), b.format(N=n)) for n in MINI_STEPS for a, b in TESTS] + MATCHED)


def pair_tests(cells: dict, pairs: list[tuple[str, str]]) -> list[dict]:
    """Fisher's exact test on sustained collapse counts and the permutation test on max drawdown, a vs b, for each
    pair whose cells both have runs (an aliased pair, or a pair seen already, is skipped)."""
    res, seen = [], set()
    for a, b in pairs:
        if a not in cells or b not in cells or alias(a) == alias(b) or (alias(a), alias(b)) in seen:
            continue
        if not cells[a]["n"] or not cells[b]["n"]:  # a partial grid: no test on a cell without runs yet
            continue
        seen.add((alias(a), alias(b)))
        ca, cb = cells[a], cells[b]
        res.append(dict(a=a, b=b, metric="collapsed", p=fisher_exact(ca["collapsed"], ca["n"], cb["collapsed"],
                                                                       cb["n"]),
                        effect=(ca["collapsed"] / ca["n"] - cb["collapsed"] / cb["n"]) if ca["n"] and cb["n"]
                        else None, counts=f"{ca['collapsed']}/{ca['n']} vs {cb['collapsed']}/{cb['n']}"))
        da, db = ([r["max_drawdown"] for r in c["runs"].values() if r["max_drawdown"] is not None] for c in (ca, cb))
        res.append(dict(a=a, b=b, metric="max_drawdown", p=permutation_test(da, db),
                        effect=_mean(da) - _mean(db) if da and db else None,
                        counts=f"mean {fmt(_mean(da))} vs {fmt(_mean(db))}"))
    return res


def cell_table(cells: dict, names: list[str], secondary: str = "any dip") -> str:
    lines = [f"| cell | collapsed (sustained) | collapsed ({secondary}) | max drawdown: median [min, max] | "
             "best / final held-out (mean) | median max grad norm | mean kl | staleness flips | engine flips |",
             "|---" * 9 + "|"]
    for c in names:
        d = cells[c]
        rs = list(d["runs"].values())
        dd = sorted(r["max_drawdown"] for r in rs if r["max_drawdown"] is not None)
        gn = sorted(r["max_grad_norm"] for r in rs if r["max_grad_norm"] is not None)
        steps = [r["collapse_step"] for r in rs if r["collapse_step"] is not None]
        name = c + (f" (= {d['alias_of']}: R2 is the identity at one mini-step)" if d["alias_of"] else "")
        lines.append(f"| {name} | {d['collapsed']} of {d['n']}{' @ ' + str(sorted(steps)) if steps else ''} | "
                     f"{d['secondary_collapsed']} of {d['n']} | "
                     f"{fmt(statistics.median(dd) if dd else None)} [{fmt(dd[0] if dd else None)}, "
                     f"{fmt(dd[-1] if dd else None)}] | {fmt(_mean([r['best_heldout'] for r in rs]))} / "
                     f"{fmt(_mean([r['final_heldout'] for r in rs]))} | {fmt(statistics.median(gn) if gn else None)} | "
                     f"{fmt(_mean([r['mean_kl'] for r in rs]))} | {fmt(_mean([r['mean_staleness_flips'] for r in rs]))}"
                     f" | {fmt(_mean([r['mean_engine_flips'] for r in rs]))} |")
    return "\n".join(lines)


def outcome_table(cells: dict, names: list[str], seeds, secondary: str = "any dip", note: str = "") -> str:
    """One row per cell, one column per seed: how each run ended, so a partial grid reads at a glance."""
    def entry(r: dict | None) -> str:
        if r is None:
            return "·"
        how = (f"**fell {r['collapse_step']}**" if r["collapse_step"] is not None else
               f"dip {r['secondary_step']}" if r["secondary_step"] is not None else "ok")
        return f"{how} ({fmt(r['best_heldout'])})"
    lines = [f"`fell S`: a sustained collapse (the primary rule) first at step S; `dip S`: the secondary rule "
             f"({secondary}) only, first at step S; `ok`: neither; in brackets the run's best held-out; `·`: not "
             f"finished yet{note}.", "",
             "| cell | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---" * (len(seeds) + 1) + "|"]
    for c in names:
        runs = cells[c]["runs"]
        lines.append(f"| {c} | " + " | ".join(entry(runs.get(str(s), runs.get(s))) for s in seeds) + " |")
    return "\n".join(lines)


def tests_table(ts: list[dict]) -> str:
    lines = ["| a | b | metric | a vs b | effect (a - b) | p |", "|---|---|---|---|---|---|"]
    lines += [f"| {t['a']} | {t['b']} | {t['metric']} | {t['counts']} | {fmt(t['effect'])} | {t['p']:.3g} |"
              for t in ts]
    return "\n".join(lines)


def plot(done: dict, cells: dict, title: str, path: str) -> None:
    """The grid's figure: rows N = 1, 4, 8, one column per engine and arm; in the N = 1 row the r2 panels (aliases)
    show the n1fresh controls instead."""
    cols = [(e, a) for e, arms in ENGINES.items() for a in arms]
    layout = [[c if alias(c) == c else f"{e}/none/n1fresh" for e, a in cols for c in [f"{e}/{a}/n{n}"]]
              for n in MINI_STEPS]
    plot_panels(done, cells, layout, title, path)


def plot_panels(done: dict, cells: dict, layout: list[list[str]], title: str, path: str) -> None:
    """Held-out accuracy against samples seen, median and min-max over seeds, and each run as a thin line (red: a
    sustained collapse), one panel per cell of `layout` (rows of cell names)."""
    nrows, ncols = len(layout), max(len(r) for r in layout)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 3 * nrows), sharex=True, sharey=True, squeeze=False)
    for i, row in enumerate(layout):
        for j, c in enumerate(row):
            ax = axes[i][j]
            series = []
            d = cells.get(c, dict(collapsed=0, n=0))
            for seed, (_, rows, _, per_step) in done.get(c, {}).items():
                series.append([((r["step"] + 1) * per_step, r["eval/accuracy"]) for r in rows
                               if r.get("eval/accuracy") is not None])
                fell = d.get("runs", {}).get(seed, {}).get("collapse_step") is not None  # runs: summarize(done)'s
                if series[-1]:
                    ax.plot(*zip(*series[-1]), lw=0.9 if fell else 0.6, color="tab:red" if fell else "0.55",
                            alpha=0.8)
            if series:
                xs = sorted({x for s in series for x, _ in s})
                at = [sorted(v for v in (dict(s).get(x) for s in series) if v is not None) for x in xs]
                ax.fill_between(xs, [v[0] for v in at], [v[-1] for v in at], alpha=0.12, label="min-max")
                ax.plot(xs, [statistics.median(v) for v in at], lw=1.8, color="tab:blue", label="median")
            if i == 0 and j == 0:
                ax.legend(handles=[matplotlib.lines.Line2D([], [], color="tab:blue", lw=1.8, label="median"),
                                   matplotlib.lines.Line2D([], [], color="0.55", lw=0.6, label="a run"),
                                   matplotlib.lines.Line2D([], [], color="tab:red", lw=0.9,
                                                           label="a run that fell (sustained)")],
                          fontsize=7, loc="upper left")
            ax.set_title(f"{c}: {d['collapsed']}/{d['n']} collapsed", fontsize=9)
            ax.set_ylim(-0.02, 1.02)
            if i == nrows - 1:
                ax.set_xlabel("samples seen")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1000:g}k"))
            if j == 0:
                ax.set_ylabel("held-out accuracy")
    fig.suptitle(textwrap.fill(title, 170), fontsize=8)  # a long flag line would run off the figure
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def pilot(args, t0: float) -> None:
    done = {}
    for lr in args.pilot_lrs:
        d = sweep(args, list(PILOT_CELLS), args.pilot_seeds, lr, os.path.join(args.out, "runs"))
        done[lr] = summarize(d, list(PILOT_CELLS))
    lines = ["| lr | cell | collapsed (sustained) | collapse steps | collapsed (any dip) | max drawdowns | "
             "final held-out |", "|---|---|---|---|---|---|---|"]
    for lr, cells in done.items():
        for c, d in cells.items():
            rs = d["runs"].values()
            lines.append(f"| {lr:g} | {c} | {d['collapsed']} of {d['n']} | "
                         f"{[r['collapse_step'] for r in rs]} | {d['secondary_collapsed']} of {d['n']} | "
                         f"{', '.join(fmt(r['max_drawdown']) for r in rs)} | "
                         f"{', '.join(fmt(r['final_heldout']) for r in rs)} |")
    complete = all(d["n"] == len(args.pilot_seeds) for cells in done.values() for d in cells.values())
    key = "fp8-router/none/n4"
    choice = min(args.pilot_lrs, key=lambda lr: (abs(done[lr][key]["collapsed"] - len(args.pilot_seeds) / 2), lr))
    verdict = (f"LR by the pre-registered pilot rule (fp8-router/none/n4 collapse count closest to half the seeds; "
               f"ties: the lower lr): {choice:g}" if complete else "**partial**: not every pilot run has finished")
    table = "\n".join(lines)
    print(table + "\n\n" + verdict)
    write_results(os.path.join(args.out, "pilot.json"),
                  dict(rule=RULE, rule_text=RULE_TEXT, lrs=args.pilot_lrs, seeds=args.pilot_seeds, steps=args.steps,
                       complete=complete, choice=choice if complete else None,
                       cells={f"{lr:g}/{c}": d for lr, cells in done.items() for c, d in cells.items()}), t0=t0,
                  md=f"Rule (fixed before any run): {RULE_TEXT}.\n\nEvery run: `{args.common}` with its cell's --lr, "
                     f"--replay none, --rollout-dtype and --mini-steps 4; seeds {list(args.pilot_seeds)}, "
                     f"{args.steps} steps.\n\n{table}\n\n{verdict}")


def grid(args, t0: float) -> None:
    if LR is None and args.lr is None:
        raise SystemExit("error: LR is not set yet: run `python -m experiments.staleness --pilot`, then write its "
                         "choice and reason into experiments/staleness.py (LR) before the grid runs")
    lr = args.lr if args.lr is not None else LR
    cells = grid_cells()
    done = sweep(args, cells, args.seeds, lr, os.path.join(args.out, "runs"))
    summ = summarize(done, cells)
    ts = tests(summ)
    complete = all(d["n"] == len(args.seeds) for d in summ.values())
    status = "" if complete else (f"**partial**: {sum(d['n'] for c, d in summ.items() if alias(c) == c)} of "
                                  f"{len([c for c in cells if alias(c) == c]) * len(args.seeds)} runs finished; "
                                  f"counts are out of the seeds finished per cell")
    commits = sorted({r["commit"] for d in summ.values() for r in d["runs"].values() if r["commit"]})
    common = with_lr(args.common, lr)
    parts = [f"Rule (fixed before any run): {RULE_TEXT}.", f"Every run: `{common}` with its cell's "
             f"--replay, --rollout-dtype and --mini-steps; {args.steps} steps (n1fresh: {args.steps * FRESH} "
             f"steps with a "
             f"quarter of the prompts, read in blocks of {FRESH}); seeds {list(args.seeds)}; runs made at "
             f"{', '.join(commits) or '—'}.", status]
    for n in MINI_STEPS:
        names = [c for c in cells if c.split("/")[2] in (f"n{n}", f"n{n}fresh")]
        parts.append(f"### N = {n} mini-step{'s' if n > 1 else ''}\n\n{cell_table(summ, names)}")
    parts.append("### Every run, by seed\n\n" + outcome_table(
        summ, [c for c in cells if alias(c) == c], args.seeds,
        note=f". n1fresh steps are counted in blocks of {FRESH} (N = 4's steps: block S is its steps {FRESH}S to "
             f"{FRESH}S + {FRESH - 1})"))
    parts.append("### Tests (Fisher's exact on collapse counts, exact permutation on max drawdown)\n\n"
                 + tests_table(ts))
    pick = most_separating(ts)
    verdict = ("no tests yet" if pick is None else
               f"N = {pick['N']}: none vs r3 collapsed {pick['counts']}, Fisher p = {pick['p']:.3g} "
               f"({pick['direction']}; drawdown p = {pick['p_drawdown']:.3g}); " +
               ("provisional: the grid is partial" if not complete else
                "it becomes experiments.collapse's default" if pick["separates"] else
                "p is not below 0.05: no setting separated the arms, the default stays"))
    parts.append(f"### The most separating setting\n\nRule (fixed at 30 of 120 runs): {SELECTION_TEXT}.\n\n"
                 f"So far: {verdict}.")
    mech = mechanism(ts, complete)
    supports = (f"the grid supports {mech['verdict']}" if mech["verdict"] else
                f"provisional (the grid is partial): {mech['provisional']}")
    if mech["staleness"]["supported"]:
        supports += (" (staleness from a replay test: its routing)" if mech["staleness"]["by_replay"] else
                     " (staleness from the fresh-minibatch tests only: not shown to be its routing)")
    against = [k for k in ("precision", "staleness") if mech[k]["against"]]
    parts.append(f"### Which mechanism\n\nRule (fixed at 32 of 120 runs): {MECHANISM_TEXT}.\n\n"
                 f"{mechanism_table(mech)}\n\nSo far: {supports}" +
                 (f"; evidence against {' and '.join(against)}{'' if complete else ' (provisional)'}"
                  if against else "") + ".")
    learn = learning(summ)
    t = learn["test"]
    parts.append(f"### Does R3 climb less?\n\nRule (fixed at 38 of 120 runs): {LEARN_TEXT}.\n\n"
                 f"{learning_table(learn)}\n\nSo far: " +
                 (f"waiting for seeds 3-7 ({len(t['seeds']) + len(t['left_out'])} of 5 finished in both cells)"
                  if t["confirmed"] is None else "confirmed" if t["confirmed"] else "not confirmed") + ".")
    st = start(summ)
    parts.append(f"### Does a seed's start say whether it climbs?\n\nRule: {START_TEXT}.\n\n{start_table(st)}\n\n"
                 "So far: " + ("it holds on seeds 5-7" if st["holds"] else "it does not hold on seeds 5-7"
                               if st["holds"] is False else "waiting for seeds 5-7") + ".")
    md = "\n\n".join(p for p in parts if p)
    print(md)
    plot(done, summ, f"{common}; {status or 'complete'}", os.path.join(args.out, "grid.png"))
    write_results(os.path.join(args.out, "grid.json"),
                  dict(steps=args.steps, lr=lr, seeds=list(args.seeds), rule=RULE_TEXT, rule_params=RULE,
                       complete=complete, common=common, cells=summ, tests=ts, selection_rule=SELECTION_TEXT,
                       most_separating=pick, mechanism_rule=MECHANISM_TEXT, mechanism=mech,
                       learning_rule=LEARN_TEXT, learning=learn, start_rule=START_TEXT, start=st), t0=t0, md=md)


def controls(args, t0: float) -> None:
    """The follow-up controls at N (CONTROL_N_TEXT; --control-n for probes), beside the grid's cells at that N."""
    lr = args.lr if args.lr is not None else LR
    probe = (args.control_n is not None or list(args.seeds) != list(SEEDS) or lr != LR or args.steps != STEPS
             or args.common != HEADLINE)
    if args.control_n is not None:
        n, why = args.control_n, f"N = {args.control_n} given by --control-n (a probe, not the rule's choice)"
    else:
        path = os.path.join(args.out, "grid.json")
        try:
            with open(path) as f:
                g = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: {path}: cannot read the grid ({e}); the controls' N comes from the complete "
                             f"grid: run the grid first, or pass --control-n for a probe")
        try:
            complete, grid_run = g["complete"], (g["seeds"], g["lr"], g["steps"])
            falls = {k: (g["cells"][f"{CONTROL_ENGINE}/none/n{k}"]["collapsed"],
                         g["cells"][f"{CONTROL_ENGINE}/none/n{k}"]["n"]) for k in (4, 8)}
        except (KeyError, TypeError, AttributeError) as e:
            raise SystemExit(f"error: {path}: not a grid.json written by experiments.staleness (no {e})")
        if not complete:
            raise SystemExit(f"error: {path}: the grid is partial; the controls' N comes from the complete grid "
                             f"(CONTROL_N_TEXT): finish it first, or pass --control-n for a probe")
        if grid_run != (list(SEEDS), LR, STEPS):
            raise SystemExit(f"error: {path}: a grid of seeds {grid_run[0]}, lr {grid_run[1]}, {grid_run[2]} steps, "
                             f"not the pre-registered one (seeds {list(SEEDS)}, lr {LR}, {STEPS} steps): the "
                             f"controls' N comes from that; pass --control-n for a probe")
        n = control_n(g)
        why = f"N = {n} by the rule ({CONTROL_ENGINE}/none sustained collapses in the grid: " + ", ".join(
            f"N = {k}: {c} of {m}" for k, (c, m) in falls.items()) + ")"
    names = control_cells(n)
    done = sweep(args, names, args.seeds, lr, os.path.join(args.out, "runs"))
    summ = summarize(done, names)
    ts = pair_tests(summ, [(names[0], c) for c in names[2:]] + [(names[1], c) for c in names[2:]])
    v = control_verdict(summ, n, args.seeds, probe)
    common = with_lr(args.common, lr)
    finished = sum(d["n"] for d in summ.values())
    status = (f"**a probe**: not the pre-registered controls (--control-n, or other seeds, lr, steps or flags); "
              f"{finished} of {len(names) * len(args.seeds)} runs finished" if probe else
              "" if v["decided"] else f"**partial**: {finished} of {len(names) * len(args.seeds)} runs finished")
    lines = ["| mechanism | predicts more collapses in | than in | collapsed | Fisher p | Holm p | reading |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {k} | {t['a']} | {t['b']} | {t['counts']} | {t['p']:.3g} | {t['p_holm']:.3g} | {t['reading']} |"
              for k, t in v["tests"].items()]
    parts = [f"Rule (fixed before any run): {RULE_TEXT}.", f"Which N (fixed at 46 of 120 grid runs, before any "
             f"control ran): {CONTROL_N_TEXT}. Here: {why}.", f"Every run: `{common}` with its cell's --replay "
             f"(none for the controls), --rollout-dtype and --mini-steps {n}; dense adds `--dense`, clip sets "
             f"`--clip-low 0.2 --clip-high 0.28`; seeds {list(args.seeds)}, {args.steps} steps.", status,
             cell_table(summ, names), "### Every run, by seed\n\n" + outcome_table(summ, names, args.seeds),
             "### Tests (Fisher's exact on collapse counts, exact permutation on max drawdown)\n\n" + tests_table(ts),
             f"### What the controls say\n\nRule (fixed at 46 of 120 grid runs): {CONTROL_TEXT}.\n\n" +
             "\n".join(lines) + "\n\n" +
             ("Decided." if v["decided"] else "A probe: no reading is a result." if probe else
              "Provisional: not every run has finished.")]
    md = "\n\n".join(p for p in parts if p)
    print(md)
    plot_panels(done, summ, [names], f"{common} --mini-steps {n}; {status or 'complete'}",
                os.path.join(args.out, "controls.png"))
    write_results(os.path.join(args.out, "controls.json"),
                  dict(steps=args.steps, lr=lr, seeds=list(args.seeds), N=n, why_N=why, n_rule=CONTROL_N_TEXT,
                       rule=RULE_TEXT, control_rule=CONTROL_TEXT, complete=v["decided"], probe=probe, common=common,
                       cells=summ, tests=ts, verdict=v), t0=t0, md=md)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--pilot", action="store_true", help="run (or report) the pilot instead of the grid")
    which.add_argument("--controls", action="store_true", help="run (or report) the follow-up controls (dense "
                                                                "twin, PPO clipping) at the N the complete grid picks")
    p.add_argument("--control-n", type=int, default=None, choices=(4, 8),
                   help="the controls' N, instead of the complete grid's pick (probes and tests only)")
    p.add_argument("--report", action="store_true", help="launch nothing: tables from the finished runs")
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="grid seeds")
    p.add_argument("--pilot-seeds", type=int, nargs="+", default=list(PILOT_SEEDS), help="pilot seeds")
    p.add_argument("--pilot-lrs", type=float, nargs="+", default=list(PILOT_LRS), help="pilot learning rates")
    p.add_argument("--lr", type=float, default=None, help="override LR (tests and probes; not the grid's)")
    p.add_argument("--common", default=HEADLINE, help="train.py flags every cell shares (tests and probes only)")
    p.add_argument("--steps", type=int, default=STEPS, help="steps per run (tests and probes only)")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (one thread each)")
    p.add_argument("--out", default="results/staleness", help="output folder (runs in OUT/runs)")
    p.add_argument("--records", default=None, help="run records folder (default OUT/records; with --report, tables "
                                                   "from records made elsewhere, e.g. the committed ones)")
    args = p.parse_args(argv)
    if args.control_n is not None and not args.controls:
        p.error("--control-n sets the controls' N: it needs --controls")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    print(f"rule (pre-registered): {RULE_TEXT}")
    t0 = time.time()
    (pilot if args.pilot else controls if args.controls else grid)(args, t0)

