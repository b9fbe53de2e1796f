"""Put the toy where mismatch breaks RL, measure that it got there, then ask R3's question as a dose-response curve.

  python -m experiments.regime                 # the regime table and calibration: results/regime/regime.{json,md,png}
  python -m experiments.regime --grid          # the grid (tiers 1, 2; --tiers 1 2 3), resumable, --jobs 2
  python -m experiments.regime --report        # the grid's tables and figure from the runs finished so far
  python -m experiments.regime --start-only --seeds 0   # only seed 0's start-of-RL measurements (the quick check)
  python -m experiments.regime --confirm       # round 5: the confirmation on fresh seeds 8-31 (confirm.py), --jobs 2
  python -m experiments.regime --compare       # round 5: the comparison's other seven arms at lv3-clip, seeds 8-23
  python -m experiments.regime --confirm --report   # round 5's tables from its records (results/regime/confirm)
  python -m experiments.regime --levers        # issue 50: the levers' rows (lag, int4 / fp4 engines), seeds 0-7
  python -m experiments.regime --levers --report          # their table from the measurements made so far
  python -m experiments.regime --levers --grid            # the levers' pre-registered grid, seeds 32-39 (then 40-47)
  python -m experiments.regime --levers --grid --report   # its tables from its records (results/regime/levers)
  python -m experiments.regime --look          # see it here: a named seed pair of round 5 beside the committed runs

The design (dial positions, depth rule, steps rule, cells, collapse rule, tests, predictions) is fixed in
experiments/regime/design.py before any measurement; docs/regime.md reads the results. Round 5's design is
experiments/regime/confirm.py, fixed before its first run; docs/confirm.md reads its results. The levers' design
is experiments/regime/levers.py, fixed before their first measurement; docs/levers.md reads them.
"""
import argparse
import os
import time

from experiments.regime import calibrate, design
from r3.errors import run_main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", action="store_true", help="run the grid (after the calibration is committed)")
    p.add_argument("--report", action="store_true", help="the grid's (or with --confirm / --compare, round 5's) "
                   "tables from the runs finished so far")
    p.add_argument("--confirm", action="store_true", help="round 5's confirmation (experiments/regime/confirm.py); "
                   "--out defaults to results/regime/confirm")
    p.add_argument("--compare", action="store_true", help="round 5's comparison arms (the same folder)")
    p.add_argument("--levers", action="store_true", help="issue 50's levers (experiments/regime/levers.py): their "
                   "rows, or with --grid their grid; --out defaults to results/regime/levers")
    p.add_argument("--look", action="store_true", help="a short look (experiments/regime/look.py): one seed pair of "
                   "round 5's confirmation run here beside its committed runs, with the rate over all finished seeds; "
                   "--out defaults to results/regime/look")
    p.add_argument("--setting", default=None, choices=["lv3-clip", "lv3"], help="--look: the confirmation's "
                   "setting (default lv3-clip)")
    p.add_argument("--steps", type=int, default=None, help="--look: steps to run (a multiple of 50, at most 800; "
                   "default: look.py's rule, from the committed no-replay run's fall)")
    p.add_argument("--tiers", type=int, nargs="+", default=[1, 2], choices=[1, 2, 3], help="grid tiers to run")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default: the design's: 0-7 for the "
                   "grid and calibration; confirm.py's for --confirm / --compare)")
    p.add_argument("--jobs", type=int, default=2, help="runs / measurements in parallel (one thread each)")
    p.add_argument("--out", default=None, help="output folder (tables, measure/, records/; default results/regime, "
                   "or results/regime/confirm with --confirm / --compare)")
    p.add_argument("--runs-dir", default=None, help="run folders (default OUT/runs; not committed)")
    p.add_argument("--skip", nargs="*", default=[], choices=["depth", "walk", "after", "pilot", "timing"],
                   help="calibration parts to leave out of this invocation (their rows stay pending)")
    p.add_argument("--start-only", action="store_true",
                   help="only the start-of-RL measurements of --seeds into OUT/measure (what the quick check remakes)")
    p.add_argument("--records", default=None, help="--grid/--report: run records (default OUT/records; with --look "
                   "the confirmation's, results/regime/confirm/records)")
    p.add_argument("--measured", default=None, help="--levers --report (with or without --grid): the folder whose "
                   "measure/ holds the rows' measurements (default OUT), so the rows' tables, or the grid's (whose K* "
                   "and int4 preset the rows decide), can be written elsewhere")
    p.add_argument("--calibration", default=None, help="--grid/--report: regime.json (default OUT/regime.json)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.look:
        return look_args(p, args)
    if args.steps is not None or args.setting is not None:
        p.error("--steps and --setting belong to --look")
    if sum((args.confirm, args.compare, args.levers)) > 1:
        p.error("--confirm, --compare and --levers run one part each: pass one of them")
    if args.measured is not None and not (args.levers and args.report):
        p.error("--measured is for --levers --report (the rows' or the grid's tables from measurements in another "
                "folder)")
    if args.levers:
        return levers_args(p, args)
    if args.confirm or args.compare:
        from experiments.regime import confirm
        allowed = confirm.COMPARE_SEEDS if args.compare else confirm.CONFIRM_SEEDS
        if args.seeds is not None and not set(args.seeds) <= set(allowed):
            part = "comparison" if args.compare else "confirmation"
            p.error(f"--seeds {' '.join(map(str, args.seeds))}: round 5's {part} runs seeds {allowed[0]}-"
                    f"{allowed[-1]} only (seeds 0-7 were the exploration)")
        args.out = args.out or os.path.join("results", "regime", "confirm")
        return args
    args.out = args.out or "results/regime"
    args.seeds = list(design.SEEDS) if args.seeds is None else args.seeds
    args.runs_dir = args.runs_dir or os.path.join(args.out, "runs")
    args.records = args.records or os.path.join(args.out, "records")
    args.calibration = args.calibration or os.path.join(args.out, "regime.json")
    return args


def look_args(p, args):
    from experiments.regime import confirm
    if args.confirm or args.compare or args.levers or args.grid or args.report or args.start_only:
        p.error("--look runs on its own: drop --confirm, --compare, --levers, --grid, --report and --start-only")
    if args.seeds is not None and not set(args.seeds) <= set(confirm.CONFIRM_SEEDS):
        p.error(f"--seeds {' '.join(map(str, args.seeds))}: the look runs the confirmation's seeds "
                f"{confirm.CONFIRM_SEEDS[0]}-{confirm.CONFIRM_SEEDS[-1]} only")
    if args.steps is not None and not (0 < args.steps <= confirm.STEPS and args.steps % 50 == 0):
        p.error(f"--steps {args.steps}: a multiple of 50 (the evaluation interval) from 50 to {confirm.STEPS}")
    args.setting = args.setting or "lv3-clip"
    args.out = args.out or os.path.join("results", "regime", "look")
    args.records = args.records or os.path.join("results", "regime", "confirm", "records")
    return args


def levers_args(p, args):
    from experiments.regime import levers
    allowed = levers.GRID_SEEDS + levers.EXTRA_SEEDS if args.grid else design.SEEDS
    if args.seeds is not None and not set(args.seeds) <= set(allowed):
        part = "grid runs seeds 32-47" if args.grid else "rows are measured on the regime table's seeds 0-7"
        p.error(f"--seeds {' '.join(map(str, args.seeds))}: the levers' {part} only")
    if not args.grid:
        args.seeds = list(design.SEEDS) if args.seeds is None else args.seeds
    args.out = args.out or os.path.join("results", "regime", "levers")
    args.runs_dir = args.runs_dir or os.path.join(args.out, "runs")
    args.records = args.records or os.path.join(args.out, "records")
    return args


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    if args.levers:
        from experiments.regime import levers_run
        return levers_run.main(args, t0)
    if args.look:
        from experiments.regime import look
        return look.main(args, t0)
    if args.confirm or args.compare:
        from experiments.regime import confirm_run
        return confirm_run.main(args, t0)
    if args.grid or args.report:
        from experiments.regime import run_grid
        return run_grid.main(args, t0)
    return calibrate.main(args, t0)


if __name__ == "__main__":
    run_main(main)
