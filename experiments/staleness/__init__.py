"""The staleness study: routing staleness or precision mismatch? A pre-registered engine x replay x mini-steps grid.
Results in results/staleness/ (and results/starts.*); read in docs/staleness.md.

  design.py    everything fixed before the runs: cells and their flags, pilot, tests, the readings' rules, controls
  analysis.py  reading the finished runs: cell summaries, tests, each pre-registered reading
  report.py    the readings' tables and the grid's figures
  grid.py      runs the grid, its pilot and its follow-up controls and writes their tables (`python -m
               experiments.staleness`)
  falls.py     exploratory: each fall's telemetry beside stable seeds (`python -m experiments.staleness.falls`)
  plateaus.py  exploratory: the cipher symbols runs got stuck on (`python -m experiments.staleness.plateaus`)
  starts.py    exploratory: where each seed's warm-up leaves it (`python -m experiments.staleness.starts`)
Imports: r3, the shared modules at the top of experiments/ and this package; never another study.
"""
