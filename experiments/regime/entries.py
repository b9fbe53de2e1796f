"""The regime study's committed results, as experiments.reproduce remakes and checks them (regime, regime_grid,
confirm, levers_rows). Gathered by experiments/registry.py; the fields are experiments/entry.py's.
"""
from experiments.entry import Check, Entry
from experiments.seed_band import Band, Key

REGIME_CHECKED = ("natural", "lv15", "lv7", "lv5", "lv3", "oracle")  # the settings whose seed-0 start is rechecked
# the regime table's claims (README, docs/regime.md): flips, kl with and without replay, R3's cut, and S
REGIME_KEYS = (Key("router_flip_rate"), Key("token_flip_rate"), Key("kl", "log"), Key("kl_r3", "log"),
               Key("kl/kl_r3", "log", null=1.0, side=">"), Key("exposure", "log"))

ENTRIES = (
    Entry("regime", "results/regime", ("regime.json", "regime.md", "regime.png",
                                       *(f"measure/start-{name}-s0.json" for name in REGIME_CHECKED),
                                       "measure/fixed80-natural-s0.json", "measure/start-*-s[1-9].json",
                                       "measure/fixed80-natural-s[1-9].json", "measure/after-*.json",
                                       "measure/depth-*.json", "measure/walk-*.json", "measure/timing.json",
                                       "pilot-records/*.jsonl.gz", "demo-records/*.jsonl.gz"),
          ("python -m experiments.regime --jobs 2 --out {out}",), wall_s=14400,
          check_commands=("python -m experiments.regime --start-only --seeds 0 --jobs 1 --out {out}",),
          check_wall_s=60, quick=True,
          checks=tuple(Check(f"measure/start-{name}-s0.json", default="seed 0's start-matched warm-up, sampled and "
                             "scored on one thread") for name in REGIME_CHECKED)
          + (Check("measure/fixed80-natural-s0.json"),),
          bands=tuple(Band(f"measure/{name}-s0.json", f"measure/{name}-s[0-7].json", REGIME_KEYS)
                      for name in (*(f"start-{n}" for n in REGIME_CHECKED), "fixed80-natural")),
          note="the regime table and calibration, before any grid run: start-of-RL measurements of every setting "
               "(seeds 0-7), the none/n4 grid runs to step 200 and their policies measured, the steps pilot (r3 at "
               "the strongest position, 1000 steps), the depth rule's warm-ups (up to 48 layers), the walk task and "
               "its demo (regime.md names the parts still pending); one JSON per measurement in measure/, made once "
               "and reused. The quick check remakes seed 0's start measurements exactly. Wall measured beside other "
               "work on 2 shared cores (several hours)"),
    Entry("regime_grid", "results/regime", ("grid.json", "grid.md", "grid.png", "kl.png", "dose.png",
                                              "records/*.jsonl.gz"),
          ("python -m experiments.regime --grid --jobs 2 --out {out}",), wall_s=90000,
          check_commands=("python -m experiments.regime --report --records results/regime/records "
                          "--calibration results/regime/regime.json --out {out}",), check_wall_s=30, quick=True,
          any_cpu="made from the committed run records and regime.json",
          checks=(Check("grid.json", default="the tables are a function of the committed run records and "
                                             "regime.json"),),
          note="tiers 1 and 2 of the pre-registered dose-response grid (experiments/regime/design.py), one record "
               "per finished run; PARTIAL until grid.json says complete: `--report` rewrites the tables from the "
               "runs finished so far and the command resumes the rest (about 25 core-hours)"),
    Entry("confirm", "results/regime/confirm", ("confirm.json", "confirm.md", "confirm.png", "made_on.json",
                                               "records/*.jsonl.gz"),
          ("python -m experiments.regime --confirm --jobs 2", "python -m experiments.regime --compare --jobs 2",
           "python -m experiments.made_on results/regime/confirm/records --report results/regime/confirm/confirm.json "
           "--runs results/regime/confirm/runs", "python -m experiments.regime --confirm --report"),
          wall_s=300000,
          check_commands=("python -m experiments.regime --confirm --report --records results/regime/confirm/records "
                          "--out {out}",), check_wall_s=20, quick=True,
          any_cpu="made from the committed run records, not by a model",
          checks=(Check("confirm.json", default="the tables are a function of the committed run records (and of "
                                                "the regime grid's, for the pooled numbers)"),),
          note="round 5 (experiments/regime/confirm.py, fixed before its runs): 96 confirmation runs and 112 "
               "comparison runs of 800 steps, one record per finished run; PARTIAL until confirm.json says complete "
               "(`--report` rewrites the tables from the runs finished so far, the commands resume the rest; 7-9 min "
               "a run with two runs on the two otherwise idle cores (seeds 20-21), about 20 beside other work; some "
               "30 core-hours in all)"),
    Entry("levers_rows", "results/regime/levers", ("rows.json", "rows.md", "rows.png", "measure/*.json",
                                                   # the rows' runs (seeds 0-7), not the grid's (-clip-, seeds 32-47)
                                                   "records/lag?-none-n4-s?.jsonl.gz",
                                                   "records/*-[fi]*4-none-n4-s?.jsonl.gz"),
          ("python -m experiments.regime --levers --jobs 2",), wall_s=12000,
          check_commands=("python -m experiments.regime --levers --report --measured results/regime/levers "
                          "--out {out}",), check_wall_s=10, quick=True,
          any_cpu="made from the committed measurements, not by a model",
          checks=(Check("rows.json", default="the tables are a function of the committed measurements (and of "
                                             "the regime table's regime.json)"),),
          note="issue 50's rows (experiments/regime/levers.py, fixed before their first measurement): low-bit "
               "engines at the start of RL and after 200 steps, rollout lag K = 1, 2, 4, 8 over steps 50-190, seeds "
               "0-7; one JSON per measurement in measure/, made once and reused, row by row; PARTIAL until rows.json "
               "says complete (about 4-5 core-hours in all, an estimate; on one core beside two other runs the starts "
               "took 15 min and a lag row of 8 runs about 30)"),
)
