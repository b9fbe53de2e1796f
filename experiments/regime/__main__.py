"""Put the toy where mismatch breaks RL, measure that it got there, then ask R3's question as a dose-response curve.

  python -m experiments.regime                 # the regime table and calibration: results/regime/regime.{json,md,png}
  python -m experiments.regime --grid          # the grid (tiers 1, 2; --tiers 1 2 3), resumable, --jobs 2
  python -m experiments.regime --report        # the grid's tables and figure from the runs finished so far
  python -m experiments.regime --start-only --seeds 0   # only seed 0's start-of-RL measurements (the quick check)

The design (dial positions, depth rule, steps rule, cells, collapse rule, tests, predictions) is fixed in
experiments/regime/design.py before any measurement; docs/regime.md reads the results.
"""
import argparse
import os
import time

from experiments.regime import calibrate, design
from r3.errors import run_main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", action="store_true", help="run the grid (after the calibration is committed)")
    p.add_argument("--report", action="store_true", help="the grid's tables from the runs finished so far")
    p.add_argument("--tiers", type=int, nargs="+", default=[1, 2], choices=[1, 2, 3], help="grid tiers to run")
    p.add_argument("--seeds", type=int, nargs="+", default=list(design.SEEDS), help="seeds")
    p.add_argument("--jobs", type=int, default=2, help="runs / measurements in parallel (one thread each)")
    p.add_argument("--out", default="results/regime", help="output folder (tables, measure/, records/)")
    p.add_argument("--runs-dir", default=None, help="run folders (default OUT/runs; not committed)")
    p.add_argument("--skip", nargs="*", default=[], choices=["depth", "walk", "after", "pilot", "timing"],
                   help="calibration parts to leave out of this invocation (their rows stay pending)")
    p.add_argument("--start-only", action="store_true",
                   help="only the start-of-RL measurements of --seeds into OUT/measure (what the quick check remakes)")
    p.add_argument("--records", default=None, help="--grid/--report: run records (default OUT/records)")
    p.add_argument("--calibration", default=None, help="--grid/--report: regime.json (default OUT/regime.json)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    args.runs_dir = args.runs_dir or os.path.join(args.out, "runs")
    args.records = args.records or os.path.join(args.out, "records")
    args.calibration = args.calibration or os.path.join(args.out, "regime.json")
    return args


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    if args.grid or args.report:
        from experiments.regime import run_grid
        return run_grid.main(args, t0)
    return calibrate.main(args, t0)


if __name__ == "__main__":
    run_main(main)
