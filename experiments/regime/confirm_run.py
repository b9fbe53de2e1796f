"""Run round 5 (confirm.py fixes what) and write its tables: `python -m experiments.regime --confirm` / `--compare`.

  arm_run(cell, seed, runs_dir)   (run folder, train.py flags, steps) of one run: the grid's own runs for none, r2
                                  and r3 (grid.cell_run), the comparison's arms as lv3-clip/none/n4 plus their flags
  plan(part, runs_dir)            every run of the confirmation or the comparison, seed-major
Runs are the sweep's (experiments/sweep.py): resumable, one record per finished run in OUT/records, from which every
table is made (confirm_report.py). OUT is results/regime/confirm.
"""
import os

from experiments.regime import confirm
from experiments.regime.grid import cell_run
from experiments.sweep import finished, run_all, set_flag


def arm_run(cell: str, seed: int, runs_dir: str) -> tuple[str, list[str], int]:
    setting, arm, n = cell.split("/")
    if arm in ("none", "r2", "r3"):
        return cell_run(cell, seed, runs_dir, confirm.STEPS)
    if arm not in confirm.ARMS:
        raise ValueError(f"unknown arm {arm!r} in {cell!r}; choose from {', '.join(confirm.ARMS)}")
    _, flags, steps = cell_run(f"{setting}/none/{n}", seed, runs_dir, confirm.STEPS)
    for name, value in confirm.ARMS[arm]:
        flags = set_flag(flags, name, value)
    return os.path.join(runs_dir, f"{setting}-{arm}-{n}-s{seed}"), flags, steps


def plan(part: str, runs_dir: str, seeds=None) -> list[tuple[str, int, str, list[str], int]]:
    """(cell, seed, run folder, flags, steps) of `part` ("confirm" or "compare"), optionally only some seeds."""
    pairs = confirm.confirm_runs() if part == "confirm" else confirm.compare_runs()
    return [(c, s, *arm_run(c, s, runs_dir)) for c, s in pairs if seeds is None or s in seeds]


def collect(runs: list[tuple], records: str) -> dict:
    """{cell: {seed: (header, rows)}} of the finished runs among `runs`."""
    done = {}
    for c, s, out, flags, steps in runs:
        if (rec := finished(out, flags, steps, records)) is not None:
            done.setdefault(c, {})[s] = rec
    return done


def main(args, t0: float) -> dict:
    part = "compare" if args.compare else "confirm"
    runs_dir = args.runs_dir or os.path.join(args.out, "runs")
    records = args.records or os.path.join(args.out, "records")
    todo = plan(part, runs_dir, None if args.seeds is None else set(args.seeds))
    if not args.report:
        run_all([(o, f, n) for _, _, o, f, n in todo], jobs=args.jobs, log_dir=os.path.join(runs_dir, "logs"),
                records=records)
    from experiments.regime import confirm_report
    confirm_runs = plan("confirm", runs_dir)
    compare_runs = plan("compare", runs_dir)
    return confirm_report.write(collect(confirm_runs, records), collect(compare_runs, records), out=args.out,
                                t0=t0, made_on=os.path.join(os.path.dirname(os.path.abspath(records)), "made_on.json"))
