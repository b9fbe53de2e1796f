"""The registry of committed results: every study's entries (experiments/STUDY/entries.py, declared beside its
design) and those of the shared scripts at the top of experiments/ (the README's job, the held-out overlap, the
claims), in one tuple. `experiments/reproduce.py` is the machinery that remakes and checks them; an entry's fields are
experiments/entry.py's. To add a result, append an `Entry` to its study's entries.py; `tests/test_claims.py` holds
that every entry can pass on a kind of CPU no file was made on.
"""
from experiments.collapse.entries import ENTRIES as COLLAPSE
from experiments.entry import WALL, Check, Entry
from experiments.length.entries import ENTRIES as LENGTH
from experiments.mismatch.entries import ENTRIES as MISMATCH
from experiments.regime.entries import ENTRIES as REGIME
from experiments.servers.entries import ENTRIES as SERVERS
from experiments.speed.entries import ENTRIES as SPEED
from experiments.staleness.entries import ENTRIES as STALENESS

SHARED = (
    Entry("quickstart", "results", ("quickstart.json", "quickstart.md"),
          ("python -m experiments.quickstart --run-dir {tmp}/run --out {out}/quickstart.json",), wall_s=360,
          quick=True, quick_interval=False,
          checks=(Check("quickstart.json", (("peak_rss_gb", "skip", "memory: the machine's"),),
                                    default="one seeded train.py process on one thread"),),
          note="the README's main job, `python train.py --r3`, and the figures the README quotes from it; where this "
               "kind of CPU has no exact reference its claims' interval check remakes 8 train.py runs (about 30 "
               "minutes on 2 cores), too long for --quick: `--check --only quickstart` runs it"),
    Entry("heldout_overlap", "results", ("heldout_overlap.json", "heldout_overlap.md"),
          ("python -m experiments.heldout_overlap --out {out}/heldout_overlap.json",), wall_s=300, quick=True,
          check_commands=("python -m experiments.heldout_overlap --score-seeds --out {out}/heldout_overlap.json",),
          check_wall_s=20, any_cpu="seeded random streams, replayed: no model's arithmetic",
          checks=(Check("heldout_overlap.json", (("scores*", "skip", "the check scores no model (two warm-ups)"),),
                        default="the warm-up's and the held-out draw's seeded streams, replayed"),),
          note="a known flaw: the warm-up draws from the whole task, so at init seed 0 it trains on the cipher "
               "held-out set (docs/results.md, Held-out accuracy)"),
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
)
REGISTRY = (*MISMATCH, *SPEED, *SHARED, *STALENESS, *LENGTH, *REGIME, *SERVERS, *COLLAPSE)
BY_NAME = {e.name: e for e in REGISTRY}
