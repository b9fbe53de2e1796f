"""The mismatch study: the paper's train/inference mismatch table at toy scale, by precision, and what the engine's
faster kernels did to the mismatch. Results in results/mismatch_table.*, results/mismatch_precisions/ and
results/numerics.*; read in docs/results.md and docs/speed.md.

  table.py     dense vs MoE vs MoE + R3, per preset and rollout precision (`python -m experiments.mismatch`)
  numerics.py  the mismatch under the engine's old and new kernels, paired (`python -m experiments.mismatch.numerics`)
Imports: r3, the shared modules at the top of experiments/ and this package; never another study.
"""
