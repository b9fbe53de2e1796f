"""The staleness study: routing staleness or precision mismatch? A pre-registered engine x replay x mini-steps grid.
Results in results/staleness/ (and results/starts.*); read in docs/staleness.md.

  grid.py      the grid, its pilot and its follow-up controls (`python -m experiments.staleness`)
  falls.py     exploratory: each fall's telemetry beside stable seeds (`python -m experiments.staleness.falls`)
  plateaus.py  exploratory: the cipher symbols runs got stuck on (`python -m experiments.staleness.plateaus`)
  starts.py    exploratory: where each seed's warm-up leaves it (`python -m experiments.staleness.starts`)
"""
