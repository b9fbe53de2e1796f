"""The speed study: ours against transformers, and what recording and replay cost. Results in results/speed*.*,
results/overhead.json and results/storage.json; read in docs/speed.md (and docs/routes.md for storage).

  __main__.py    `python -m experiments.speed`: MoE block, train step, generation, scaling, decode, compile, RL step
  overhead.py    R3's cost: recording, replay, route codecs, prefix reuse (`python -m experiments.speed.overhead`)
  storage.py     route codecs: bytes and throughput (`python -m experiments.speed.storage`)
  step_timer.py  one train.py run with each phase timed: the RL step section's helper, run by path
"""
