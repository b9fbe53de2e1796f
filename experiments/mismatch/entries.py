"""The mismatch study's committed results, as experiments.reproduce remakes and checks them (mismatch_table,
mismatch_precisions, inspect, numerics). Gathered by experiments/registry.py; the fields are experiments/entry.py's.
"""
from experiments.entry import Check, Entry, WALL

ENTRIES = (
    Entry("mismatch_table", "results", ("mismatch_table.json", "mismatch_table.png"),
          ("python -m experiments.mismatch --out {out}",), wall_s=90, quick=True,
          checks=(Check("mismatch_table.json", (("wall_s", "skip", WALL),)),)),
    Entry("mismatch_precisions", "results/mismatch_precisions", ("mismatch_table.json", "mismatch_table.png",
                                                                 "stdout.txt"),
          ("python -m experiments.mismatch --presets toy qwen3-ratio --dtypes bf16 fp8 fp8-channel fp8-router "
           "int4 fp4 --prompts 128 --out {out}",), wall_s=150, quick=True, stdout="stdout.txt",
          checks=(Check("mismatch_table.json", (("wall_s", "skip", WALL),)),)),
    Entry("inspect", "results", ("inspect.json", "inspect.png", "inspect.html"),
          ("python rollout.py --task sort --rollout-dtype fp8 --warmup-steps 200 --prompts-per-step 512 "
           "--group-size 8 --out {tmp}/rollout_fp8",
           "python -m r3.inspect {tmp}/rollout_fp8 --warmup-steps 200 --out {out}/inspect"),
          wall_s=40, quick=True, checks=(Check("inspect.json"),),
          note="the rollout is the fp8 table's batch (same model, prompts and seed)"),
    Entry("numerics", "results", ("numerics.json", "numerics.md"),
          ("python -m experiments.mismatch.numerics --out {out}/numerics.json",), wall_s=600,
          checks=(Check("numerics.json"),),
          note="the mismatch under the engine's old and new decode kernels, paired; 123 s with the warm-ups cached "
               "in .cache/warmup, several minutes more on a fresh clone"),
)
