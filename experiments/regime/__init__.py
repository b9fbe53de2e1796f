"""The regime study (issue 37): the toy moved into the regime where train/inference mismatch breaks RL, measured
there before any RL run, then R3 against no replay along a routing-mismatch dial.

  design.py     everything fixed before measuring: dial positions, depth and steps rules, cells, rule, tests,
                predictions
  measure.py    the regime quantities of one (model, setting): flips, |log r| quantiles, kl, length, entropy, S
  calibrate.py  the regime table and calibration (results/regime/regime.*)
  grid.py       the grid's runs, per-run numbers and tests;  run_grid.py  runs it and writes its tables
  confirm.py    round 5's design (issue 49), fixed before its runs: the confirmation on fresh seeds 8-31 and the
                comparison of corrections at lv3-clip;  confirm_run.py  runs it;  confirm_report.py  its tables
  levers.py     issue 50's design (rollout lag, low-bit engines), fixed before measuring; levers_measure.py its
                rows, levers_report.py their tables and the grid's two rules, levers_run.py its grid (docs/levers.md)
Run it as `python -m experiments.regime` (see __main__.py). Imports: r3 and experiments' shared runner and
statistics, and the staleness grid's collapse rule (experiments/rules.py, used unchanged).
"""
