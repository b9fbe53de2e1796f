"""runs/: what a run leaves on disk and how it is read back. May import r3.errors and model/.

  io.py          atomic writes (temp, fsync, rename), JSON and JSONL files
  validate.py    checks before any work: a batch's fields, a batch against a model, a model config, a weight
  checkpoint.py  weights and resumable checkpoints (safetensors), the model digest
  runfolder.py   the locked run folder: resume, overwrite, metrics.jsonl, the guard's snapshots
  interrupt.py   SIGINT / SIGTERM / SIGUSR1: stop at a step boundary, one line that says how to go on
  provenance.py  the commit, command and machine behind a result
  ema.py         the reward's running mean that the collapse guard watches and the figures show
  plots.py       one run's panels, runs overlaid (`python -m r3.plots`), the inspector's figure, TensorBoard
  process.py     CPU threads and the allocator
"""
