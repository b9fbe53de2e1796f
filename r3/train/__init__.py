"""train/: from samples to an update. May import r3.errors and every wing below (model/, runs/, scale/, tasks/,
rollout/).

  config.py    every flag of train.py and rollout.py, with its domain
  collect.py   a step's samples: prompts -> samples with routes -> rewards -> group advantages; data shards
  score.py     the trainer's log-probs and the old-policy pass: π_old, the routes to replay, the mismatch
  grpo.py      GRPO / Dr. GRPO / GSPO losses, TIS / IcePop / MIS, returning (loss, metrics)
  metrics.py   mismatch metrics: kl, F(τ), flip rates
  evaluate.py  held-out evaluation;  fidelity.py  gradient fidelity: the update against the on-policy gradient
  guard.py     the collapse guard;  lag.py  --rollout-lag: the FIFO of the engine's past weights
  warmup.py    the cached supervised warm-up and `load_model`;  launch.py  train.py's policy, task and engines
"""
