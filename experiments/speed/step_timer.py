"""Run one `train.py` command in-process with each phase of the step timed; a helper of experiments/speed/step.py.

    PYTHONPATH=TREE python experiments/speed/step_timer.py TREE OUT.json TRAIN_FLAGS...

TREE is a checkout (this one, or an older commit unpacked by step.py): its `train.py` is imported and run from its
root, so the same harness times today's code and an old commit's. PYTHONPATH=TREE is what makes `import train` (and
the `r3` it imports) that checkout's; step.py sets it, and a train.py from anywhere else is refused. Each of
train.py's phase functions that exists in that checkout (PHASES) is wrapped in a timer; OUT.json gets the wall time
of `train.main` and the seconds spent in each phase, and the process's minor page faults (r3/runs/process.py).
Phases nest as train.py calls them (`update` holds every mini-step, `log_guard_checkpoint` holds held-out
evaluation, val/kl and checkpoints), so the phases are not summed. Start-up (imports, the warm-up load) is inside
the wall time; step.py cancels it by subtracting a short run from a long one.
"""
import json
import os
import resource
import sys
import time

PHASES = ("collect", "old_policy", "old_policy_pass", "fidelity", "update", "sync_engine", "step_metrics",
          "log_guard_checkpoint", "evaluate", "validate", "save")


def main() -> None:
    tree, out, *argv = sys.argv[1:]
    tree = os.path.abspath(tree)
    os.chdir(tree)
    import train  # the checkout's own train.py, found through PYTHONPATH=TREE
    if os.path.dirname(os.path.realpath(train.__file__)) != os.path.realpath(tree):
        sys.exit(f"error: imported {train.__file__}, not {tree}'s train.py: run with PYTHONPATH={tree}")
    seconds: dict[str, float] = {}

    def timed(name, fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
        return run

    for name in PHASES:
        if callable(getattr(train, name, None)):
            setattr(train, name, timed(name, getattr(train, name)))
    t0 = time.perf_counter()
    train.main(argv)
    wall = time.perf_counter() - t0
    with open(out, "w") as f:
        json.dump(dict(wall_s=wall, cpu_s=time.process_time(), phases=seconds,
                       minor_faults=resource.getrusage(resource.RUSAGE_SELF).ru_minflt), f)


if __name__ == "__main__":
    main()
