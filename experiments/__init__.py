"""The experiments behind results/: one package per study, named as its results/ folder and its docs/ page are, and
the modules every study shares at the top.

  collapse/   the collapse protocol (no replay, R3, fp32 oracle) and the ablations
  staleness/  routing staleness or precision: the engine x replay x mini-steps grid; its falls, plateaus, starts
  length/     the sequence-level IS gradient on long responses
  mismatch/   the paper's mismatch table, by precision; what the engine's faster kernels did to the mismatch
  speed/      ours against transformers, what recording and replay cost, route storage
  regime/     the toy moved to where mismatch breaks RL, then R3 against no replay along a mismatch dial
Shared: sweep.py (train.py arms as subprocesses, run records, the headline flags), rules.py (the collapse rules and
the grids' tables), stats.py (exact tests over seeds), common.py (tables and results files with provenance),
legacy.py (the engine's kernels before the speed changes). quickstart.py and heldout_overlap.py measure what every
study starts from (the README's main job; the warm-up's overlap with the held-out set); reproduce.py remakes or
checks every results file.
A study imports r3, the shared modules and its own package, never another study; the shared modules import no study
(tests/test_layout.py). `python -m experiments.STUDY` runs STUDY/__main__.py.
"""
