"""The long-response study: the sequence-level IS gradient as responses grow, one mini-step (precision only).
Results in results/length/; read in docs/length.md.

  grid.py  the sizing, the learnability check and the grid (`python -m experiments.length`)
Imports: r3, the shared modules at the top of experiments/ and this package; never another study.
"""
