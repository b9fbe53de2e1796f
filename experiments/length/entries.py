"""The length study's committed results, as experiments.reproduce remakes and checks them (length_sizing,
length_learnability, length_grid). Gathered by experiments/registry.py; the fields are experiments/entry.py's.
"""
from experiments.entry import Check, Entry, TIMING, WALL

ENTRIES = (
    Entry("length_sizing", "results/length", ("sizing.json", "sizing.md"),
          ("python -m experiments.length --sizing --out {out}",), wall_s=700,
          checks=(Check("sizing.json", (("*step_times_s*", "skip", TIMING), ("*est_*", "skip", TIMING),
                                        ("wall_s", "skip", WALL)),
                        default="one seeded train.py process on one thread per length"),),
          note="one 3-step fp8-router run per length (40-step warm-up each); the time estimates are rough; the runs "
               "were made on the machine before 2026-12-02's (another CPU: see above), so this one will not match "
               "them exactly"),
    Entry("length_learnability", "results/length", ("learnability.json", "learnability.md"),
          ("python -m experiments.length --learnability --lengths 64 256 1024 --jobs 1 --out {out}",), wall_s=3922,
          checks=(Check("learnability.json", default="one seeded train.py process on one thread per length"),),
          note="the oracle, 300 steps at T = 64, 256 and 1024; the wall time was measured beside the staleness "
               "pilot on 2 shared cores"),
    Entry("length_grid", "results/length", ("grid.json", "grid.md", "grid.png", "records/*.jsonl.gz"),
          ("python -m experiments.length --jobs 2 --out {out}",), wall_s=28800,
          check_commands=("python -m experiments.length --report --records results/length/records --out {out}",),
          check_wall_s=15, quick=True, any_cpu="made from the committed run records, not by a model",
          checks=(Check("grid.json", default="the tables are a function of the committed run records"),),
          note="3 cells x 3 lengths x 6 seeds x 200 steps, + 2 positive controls at T = 1024 only if no replay "
               "fell there (experiments.length.grid CONTROLS_WHEN), one record per finished run; "
               "PARTIAL until grid.json says complete (shortest length first; `--report` rewrites the tables, the "
               "command resumes). The check remakes the tables from the committed records; the runs take about "
               "16 core-hours (3 min at T = 64 to ~30 min at T = 1024 on one thread)"),
)
