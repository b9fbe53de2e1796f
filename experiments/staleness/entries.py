"""The staleness study's committed results, as experiments.reproduce remakes and checks them (staleness_pilot,
staleness_grid, staleness_falls, staleness_plateaus, starts). Gathered by experiments/registry.py; the fields are
experiments/entry.py's.
"""
from experiments.entry import Check, Entry

ENTRIES = (
    Entry("staleness_pilot", "results/staleness", ("pilot.json", "pilot.md"),
          ("python -m experiments.staleness --pilot --pilot-lrs 5e-4 7e-4 3e-4 --jobs 2 --out {out}",), wall_s=8892,
          checks=(Check("pilot.json", (("*commit", "skip", "the commit each run was made at"),),
                        default="every run is one seeded train.py process on one thread"),),
          note="2 cells x 3 lrs x 4 seeds x 1000 steps at fp32 and fp8-router; chose the grid's LR"),
    Entry("staleness_grid", "results/staleness", ("grid.json", "grid.md", "grid.png", "records/*.jsonl.gz"),
          ("python -m experiments.staleness --jobs 2 --out {out}",), wall_s=54000,
          check_commands=("python -m experiments.staleness --report --records results/staleness/records "
                          "--out {out}",), check_wall_s=15, quick=True,
          any_cpu="made from the committed run records, not by a model",
          checks=(Check("grid.json", default="the tables are a function of the committed run records"),),
          note="13 cells and 2 controls x 8 seeds x 1000 steps, one record per finished run (records/); PARTIAL "
               "until grid.json says complete: `--report` rewrites the tables from the runs finished so far and "
               "the command resumes the rest. The check remakes the tables from the committed records (the runs "
               "themselves take about 30 core-hours: 10-25 min each on one thread)"),
    Entry("staleness_falls", "results/staleness", ("falls.json", "falls.md", "falls.png"),
          ("python -m experiments.staleness.falls --grid results/staleness --out {out}",), wall_s=10, quick=True,
          any_cpu="made from the committed run records and grid.json",
          checks=(Check("falls.json", default="a function of the committed run records and grid.json"),),
          note="exploratory, not pre-registered: telemetry before and during each sustained collapse of the "
               "staleness grid against the same cell's stable seeds; partial while the grid is"),
    Entry("staleness_plateaus", "results/staleness", ("plateaus.json", "plateaus.md", "dumps/*.json.gz"),
          ("python -m experiments.staleness.plateaus --save-inputs results/staleness",
           "python -m experiments.staleness.plateaus --grid results/staleness --out {out}"), wall_s=10,
          check_commands=("python -m experiments.staleness.plateaus --grid results/staleness --out {out}",),
          check_wall_s=5, quick=True, any_cpu="made from the committed dump tokens and grid.json",
          checks=(Check("plateaus.json", default="a function of the committed dump tokens and grid.json"),),
          note="exploratory: the symbols each grid run has got stuck on in its last sample dumps, and the cap they "
               "put on exact answers; --save-inputs keeps the tokens of those dumps (dumps/) from the run folders, "
               "which are not committed"),
    Entry("starts", "results", ("starts.json", "starts.md", "starts.png"),
          ("python -m experiments.staleness.starts --out {out}",), wall_s=1100,
          checks=(Check("starts.json", (("grid*", "skip", "read from the staleness grid's grid.json and plateaus.json "
                                                          "as they stand; those are checked by their own entries"),)),),
          note="exploratory: every seed's warm-up checkpoint at 80, 160 and 320 steps scored on the held-out "
               "prompts (sampled reward, each symbol's probability), beside the grid's start, climb and stuck "
               "symbols; the wall time was measured beside the staleness grid on 2 shared cores"),
)
