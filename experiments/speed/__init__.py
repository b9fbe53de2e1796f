"""The speed study: ours against transformers, and what recording and replay cost. Results in results/speed*.*,
results/overhead.json and results/storage.json; read in docs/speed.md (and docs/routes.md for storage).

  __main__.py    `python -m experiments.speed`: runs the sections asked for and writes their tables
  bench.py       the sections against transformers (MoE block, train step, generation, scaling) and the engine's
                 kernels (decode, old against new; the torch.compile probe)
  step.py        the headline RL step at an older commit and at this checkout, alternated
  step_timer.py  one train.py run with each phase timed: step.py's helper, run by path
  overhead.py    R3's cost: recording, replay, route codecs, prefix reuse (`python -m experiments.speed.overhead`)
  storage.py     route codecs: bytes and throughput (`python -m experiments.speed.storage`)
Imports: r3, the shared modules at the top of experiments/ and this package; never another study.
"""
