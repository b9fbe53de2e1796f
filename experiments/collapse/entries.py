"""The collapse study's committed results, as experiments.reproduce remakes and checks them (collapse, collapse_h1000,
ablations, earlier_qwen3_sort, earlier_qwen3_sort_h1000, earlier_toy_sort, earlier_toy_sort_ablations,
earlier_toy_sort_ablations_m1). Gathered by experiments/registry.py; the fields are experiments/entry.py's.
"""
from experiments.entry import Check, Entry, WALL

ENTRIES = (
    Entry("collapse", "results/collapse", ("collapse.json", "collapse.md", "collapse.png", "fidelity.png",
                                           "phase.json", "phase.md", "phase.png"),
          ("python -m experiments.collapse --setting headline --phase --out {out}",), wall_s=3983,
          frozen="made before the engine's decode kernels changed (docs/speed.md): fp8-router runs at HEAD part "
                 "ways from these by rounding (results/numerics.md: the fp8-router mismatch did not move), so "
                 "HEAD cannot remake them bit for bit; the command still runs",
          checks=(Check("collapse.json", default="every run is one seeded train.py process on one thread"),
                  Check("phase.json", default="every run is one seeded train.py process on one thread")),
          note="15 runs x 400 steps + 10 x 200; the wall time was measured on 2 shared cores (uncontended ~35 min)"),
    Entry("collapse_h1000", "results/collapse/h1000", ("collapse.json", "collapse.md", "collapse.png",
                                                       "fidelity.png"),
          ("python -m experiments.collapse --setting headline --seeds 0 1 --steps 1000 --runs-dir {out}/runs "
           "--out {out}",),
          wall_s=3000,
          frozen="made before the engine's decode kernels changed (docs/speed.md): fp8-router runs at HEAD part "
                 "ways from these by rounding (results/numerics.md: the fp8-router mismatch did not move), so "
                 "HEAD cannot remake them bit for bit; the command still runs",
          checks=(Check("collapse.json", default="every run is one seeded train.py process on one thread; "
                                                 "a resumed run continues bit-identically"),),
          note="the committed runs were the 400-step runs of seeds 0 and 1 copied into {out}/runs and resumed; "
               "from scratch the same command runs all 1000 steps (resume is bit-identical); wall estimated from the "
               "400-step sweep's rate"),
    Entry("ablations", "results/ablations", ("ablations.json", "ablations.md", "ablations.png"),
          ("python -m experiments.collapse.ablations --runs-dir {out}/runs --out {out}",), wall_s=1827,
          frozen="made before the engine's decode kernels changed (docs/speed.md): fp8-router runs at HEAD part "
                 "ways from these by rounding (results/numerics.md: the fp8-router mismatch did not move), so "
                 "HEAD cannot remake them bit for bit; the command still runs",
          checks=(Check("ablations.json", (("*wall*", "skip", WALL),),
                        default="every run is one seeded train.py process on one thread"),),
          note="8 arms x 2 seeds x 300 steps at fp8-router"),
    Entry("earlier_qwen3_sort", "results/earlier/qwen3_sort",
          ("collapse.json", "collapse.md", "collapse.png", "fidelity.png", "phase.json", "phase.md", "phase.png",
           "toy_fp32_1000.metrics.jsonl", "toy_fp32_learning.md", "toy_fp32_learning.png"),
          ("python -m experiments.collapse --seeds 0 1 2 --steps 500 --phase --phase-steps 200 --phase-seeds 0 "
           "--out results/headline",), wall_s=3012,
          frozen="made at commit e1f1dd3 on sorting with the Qwen3-ratio preset; training then drew prompts from the "
                 "whole task (no held-out split), so today's code draws another stream (docs/history.md)"),
    Entry("earlier_qwen3_sort_h1000", "results/earlier/qwen3_sort/h1000",
          ("collapse.json", "collapse.md", "collapse.png", "fidelity.png"),
          ("python -m experiments.collapse --seeds 0 1 --steps 1000 --runs-dir results/headline/runs "
           "--out results/headline/h1000",),
          wall_s=1220, frozen="the extension of earlier_qwen3_sort, by the same code (docs/history.md)"),
    Entry("earlier_toy_sort", "results/earlier/toy_sort",
          ("collapse.json", "collapse.md", "collapse.png", "dose.json", "dose.md", "dose.png"),
          ("python experiments/collapse.py --dose",), wall_s=1980,
          frozen="made by the code of commit 567914e on sorting; `--dose` has since left experiments.collapse "
                 "(docs/history.md)"),
    Entry("earlier_toy_sort_ablations", "results/earlier/toy_sort_ablations",
          ("ablations.json", "ablations.md", "ablations.png"), ("python experiments/ablations.py",), wall_s=900,
          frozen="made by the code of commit 60106ff on sorting, 13 arms (docs/history.md)"),
    Entry("earlier_toy_sort_ablations_m1", "results/earlier/toy_sort_ablations_m1",
          ("ablations.json", "ablations.md", "ablations.png"),
          ("python experiments/ablations.py --seeds 0 1 2 3 4 --arms 'GRPO (1 mini-step)' 'GRPO+R3 (1 mini-step)' "
           "--out results/ablations_m1",), wall_s=None,
          frozen="made by the code of commit 567914e on sorting (docs/history.md)"),
)
