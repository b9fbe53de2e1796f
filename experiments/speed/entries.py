"""The speed study's committed results, as experiments.reproduce remakes and checks them (storage, overhead, speed,
speed_step, speed_decode, speed_compile). Gathered by experiments/registry.py; the fields are experiments/entry.py's.
"""
from experiments.entry import Check, Entry, TIMING, WALL

ENTRIES = (
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
)
