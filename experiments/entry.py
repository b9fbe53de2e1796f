"""What a committed result is to experiments.reproduce: an `Entry` (its files, the commands that make them, how they
are checked on which kind of CPU) and a `Check` per JSON file it compares. Each study declares its own entries beside
its design, in experiments/STUDY/entries.py; experiments/registry.py gathers them; experiments/reproduce.py is the
machinery that remakes and checks them.
"""
import dataclasses

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
