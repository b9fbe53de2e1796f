"""Routing staleness or precision mismatch? A pre-registered grid over engine x replay x mini-steps, 8 seeds.

  python -m experiments.staleness --pilot      # first: fp32/none/n4 and fp8-router/none/n4, 4 seeds, PILOT_LRS
  python -m experiments.staleness              # the grid at LR (set below from the pilot), resumable, --jobs 2
  python -m experiments.staleness --report     # tables and figure from the runs finished so far (marked partial)
  python -m experiments.staleness --controls   # after the grid: the dense-twin and PPO-clipping controls at its N

Two factors enter every PPO ratio at mini-step k of a batch the engine μ sampled: π_θk/π_old (staleness: the policy,
and its routing, moved during the batch's earlier mini-steps) times π_old/μ (precision: same weights, other
numerics and other routes). The fp32 engine removes the second factor, one mini-step the first; R2 freezes the
routing of the first, R3 of both. Cells ENGINE/ARM/nN, every other flag experiments.sweep's HEADLINE at --lr LR:
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
finite. Secondary: experiments.collapse's rule (DIP_RULE, any single dip), so the older tables stay comparable.
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
import os
import time

from experiments.common import fmt, write_results
from experiments.rules import RULE, RULE_TEXT, cell_table, outcome_table, tests_table
from experiments.staleness.analysis import (control_n, control_verdict, learning, mechanism, most_separating,
                                            pair_tests, start, summarize, tests)
from experiments.staleness.design import (CONTROL_ENGINE, CONTROL_N_TEXT, CONTROL_TEXT, FRESH, LEARN_TEXT, LR,
                                          MECHANISM_TEXT, MINI_STEPS, PILOT_CELLS, PILOT_LRS, PILOT_SEEDS, SEEDS,
                                          SELECTION_TEXT, START_TEXT, STEPS, alias, cell_run, control_cells,
                                          grid_cells)
from experiments.staleness.plateaus import keep_input
from experiments.staleness.report import learning_table, mechanism_table, plot, plot_panels, start_table
from experiments.sweep import HEADLINE, finished, flag_value, run_all, with_lr


def sweep(args, cells: list[str], seeds, lr: float, runs_dir: str) -> dict:
    """Run (or, without `launch`, only read) every (cell, seed), seed-major so a partial grid is balanced.
    Returns {cell: {seed: (commit, rows, block size, samples per step)}} for finished runs, read from their
    records (OUT/records, committed; experiments/sweep.py), so a fresh clone resumes and reports the grid."""
    records = args.records or os.path.join(os.path.dirname(runs_dir), "records")
    plan = [(c, s, *cell_run(c, s, lr, runs_dir, args.common, args.steps)) for s in seeds for c in cells
            if alias(c) == c]
    if not args.report:
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
                         "choice and reason into experiments/staleness/design.py (LR) before the grid runs")
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

