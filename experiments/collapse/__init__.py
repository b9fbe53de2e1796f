"""The collapse study: does R3 keep RL of the toy MoE from collapsing, against no replay and an fp32-rollout oracle?
Results in results/collapse/ and results/ablations/; read in docs/results.md.

  protocol.py   the pre-registered protocol, three arms one flag apart (`python -m experiments.collapse`)
  ablations.py  GRPO-family losses and corrections with and without R3 (`python -m experiments.collapse.ablations`)
Imports: r3, the shared modules at the top of experiments/ and this package; never another study.
"""
