"""Remake or check every committed results file: the machinery; the registry of entries is experiments/registry.py.

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
with this CPU's twin elsewhere, when one is committed. With neither (`check_kind`), an entry is still checked exactly
when its numbers are the same on every CPU (`any_cpu`: sizes, tables made from committed run records); its remade
seed is tested against the committed seeds' spread when it declares `bands` (experiments/seed_band.py: the regime
table's start-of-RL rows); the claims resting on it are remade over 8 seeds and tested against their committed
intervals (experiments/claims.py); else it is skipped with a one-line note. Never a mismatch for numbers that are
only another CPU's last bits. `R3_CHECK_AS_CPU=NAME` makes the check treat this machine as the CPU NAME (a test, or
a measurement of the check on a kind of CPU with no twins, on this machine).

    python -m experiments.reproduce --only NAME --cpu-reference   # make this CPU's twins of NAME's checked files

Some entries check with a cheaper command (`check_commands`) that recomputes exactly the keys they compare, e.g.
route sizes without the long throughput timing. Entries made by code this project has since changed are `frozen`:
listed with the command of their time and the reason, never remade or checked. To add an entry, append an `Entry` to
its study's experiments/STUDY/entries.py (experiments/registry.py gathers them).
"""
import argparse
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
from concurrent.futures import ThreadPoolExecutor

from experiments import claims, seed_band
from experiments.entry import Check, Entry
from experiments.registry import BY_NAME, REGISTRY
from r3.errors import run_main
from r3.runs.provenance import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def here() -> str:
    """The kind of CPU the check runs as: this machine's (`cpu_name()`), or R3_CHECK_AS_CPU's (a simulation)."""
    return os.environ.get("R3_CHECK_AS_CPU") or cpu_name()


def cpu_slug(name: str | None = None) -> str:
    """A folder name for a kind of CPU: `cpu_name()` lower-cased, each run of other characters one '-'."""
    return re.sub(r"[^a-z0-9_]+", "-", (name or here()).lower()).strip("-")


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
    return twin if made_on(own) != here() and os.path.exists(twin) else own


def make_cpu_reference(entry: Entry) -> None:
    """Recompute the entry's checked files as --check does and write them to this CPU's twin folder, to commit.
    Refused where the entry's own files were made on this kind of CPU: remake those with --only NAME instead."""
    if entry.frozen or not entry.checks:
        raise SystemExit(f"{entry.name}: {entry.frozen or 'checks no numbers'}; it has no CPU references")
    here_ = here()
    own = [c.file for c in entry.checks if made_on(os.path.join(ROOT, entry.out, c.file)) == here_]
    if own:
        raise SystemExit(f"{entry.name}: {', '.join(own)} was made on this kind of CPU ({here_}); a twin would be the "
                         f"same file: remake it with --only {entry.name}")
    with tempfile.TemporaryDirectory(prefix=f"reproduce-{entry.name}-") as tmp:
        out = os.path.join(tmp, "out")
        run_commands(entry, entry.check_commands or entry.commands, out, tmp, log=None)
        for c in entry.checks:
            dest = twin_path(entry, c.file)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy(os.path.join(out, c.file), dest + ".part")
            os.replace(dest + ".part", dest)
            print(f"[{entry.name}] wrote {os.path.relpath(dest, ROOT)} (made on {here_})")


def check(entry: Entry, *, root: str = ROOT, quick: bool = False) -> list[str]:
    """Recompute `entry` into a temp folder and compare with the files committed under `root`. Returns one line
    per mismatch (empty when everything matches). Where this kind of CPU has no exact reference, the entry is checked
    as `check_kind` says: by its seeds' bands, by the claims resting on it, or skipped."""
    kind = check_kind(entry, root, quick=quick)
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
        expected = entry.check_wall_s or entry.wall_s
        if kind == "seeds: band":
            report, bad = seed_band.check(entry.bands, os.path.join(root, entry.out), out)
            for line in report:
                print(f"[{entry.name}]   {line}", flush=True)
            print(f"[{entry.name}] seeds: band: {len(report)} keys of {len(entry.bands)} files tested against the "
                  f"committed seeds' spread, {'all pass' if not bad else f'{len(bad)} FAIL'} in "
                  f"{time.time() - t0:.0f} s (expected {expected:.0f} s)", flush=True)
            return [f"{entry.out}/{line}" for line in bad]
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
        print(f"[{entry.name}] exact: {n} numbers compared, {'all match' if not bad else f'{len(bad)} MISMATCHES'} in "
              f"{time.time() - t0:.0f} s "
              f"(expected {expected:.0f} s)", flush=True)
        if bad and (hint := cpu_hint(entry, root)):
            print(f"[{entry.name}] {hint}", flush=True)
        return bad


def check_kind(entry: Entry, root: str = ROOT, *, quick: bool = False) -> str:
    """How `entry` is checked on this kind of CPU: 'exact' where every checked file was made here or has this CPU's
    twin, or where its numbers are the same on any CPU (`any_cpu`); else 'seeds: band' where it declares bands; else
    'claims: interval' where claims rest on it (with `quick`, only when its interval check is quick enough); else
    'skipped: ...', one line that says why and how to check it. Never 'exact' for a model's numbers made on another
    kind of CPU: those are its last bits, not the code's."""
    here_ = here()
    if all(made_on(os.path.join(root, entry.out, c.file)) == here_ or os.path.exists(twin_path(entry, c.file, root))
           for c in entry.checks) or entry.any_cpu:
        return "exact"
    if entry.bands:
        return "seeds: band"
    made = sorted({made_on(os.path.join(root, entry.out, c.file)) or "a CPU its provenance does not name"
                   for c in entry.checks})
    if claims.resting_on(entry.name):
        if not (quick and not entry.quick_interval):
            return "claims: interval"
        return (f"skipped in --quick on this kind of CPU: no exact reference for {here_}, and the interval check of "
                f"its claims is long (see --list); run `python -m experiments.reproduce --check --only {entry.name}`")
    return (f"skipped: its numbers are exact per kind of CPU, made on {'; '.join(made)}; none is committed for "
            f"{here_} and no claim rests on it; add one with --only {entry.name} --cpu-reference")


def cpu_hint(entry: Entry, root: str = ROOT) -> str | None:
    """When a checked file was made on another kind of CPU than this one (or one its provenance does not name), say
    so: kernels differ between CPU generations, so a mismatch there may be the machine's, not the code's."""
    here_ = here()
    for c in entry.checks:
        path = reference(entry, c.file, root)
        if not os.path.isfile(path):
            continue  # check() has named what is wrong with the file itself
        made = made_on(path)
        if made != here_:
            return (f"note: {c.file} was made on {made or 'a CPU its provenance does not name (before 2026-12-04)'}, "
                    f"checked here on {here_}: numbers from a model are bit-reproducible on the kind of CPU they were "
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
    if entry.checks and not entry.frozen:
        lines.append("  on a kind of CPU without its reference: " + (
            f"exact ({entry.any_cpu})" if entry.any_cpu else
            f"seed 0 against the committed seeds' band ({', '.join(b.file for b in entry.bands)})" if entry.bands else
            "its claims over 8 seeds (experiments/claims.py)" + ("" if entry.quick_interval else ", not in --quick")
            if claims.resting_on(entry.name) else "skipped"))
    for c in entry.checks:
        lines.append(f"  checks {c.file}: other numbers exact ({c.default})")
        lines += [f"    {p}: {t if isinstance(t, str) else f'{t[0]} {t[1]:g}'} ({why})" for p, t, why in c.rules]
    if entry.note:
        lines.append(f"  note: {entry.note}")
    return "\n".join(lines)


def listing(entries=REGISTRY) -> str:
    """What `--list` prints (docs/reproduce.md holds it verbatim)."""
    return "\n\n".join(describe(e) for e in entries)


def check_all(entries: list[Entry], quick: bool, jobs: int) -> list[list[str]]:
    """check() of every entry, `jobs` at a time (threads: each check waits on its own subprocesses), the longest
    expected first so the parts pack onto the cores; the mismatch lines in `entries`' order."""
    if jobs == 1:
        return [check(e, quick=quick) for e in entries]
    longest = sorted(range(len(entries)), key=lambda i: -(entries[i].check_wall_s or entries[i].wall_s or 0))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {i: pool.submit(check, entries[i], quick=quick) for i in longest}
        return [futures[i].result() for i in range(len(entries))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="entries: " + ", ".join(BY_NAME))
    p.add_argument("--only", nargs="+", metavar="NAME", help="these entries only (remake them, or --check them)")
    p.add_argument("--check", action="store_true", help="recompute into a temp folder and compare with results/")
    p.add_argument("--quick", action="store_true", help="with --check: only the quick entries (~10 min on 2 cores)")
    p.add_argument("--jobs", type=int, default=1, help="with --check: entries checked at once (each entry's commands "
                   "keep their own thread counts, so the numbers do not change; CI passes 2, one per core)")
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
    t0 = time.time()
    skipped = [e for e in entries if e.frozen or not e.checks]
    for e in skipped:
        print(f"[{e.name}] not checked: {e.frozen or 'no numbers to compare'}")
    checked = [e for e in entries if e not in skipped]
    kinds = [check_kind(e, quick=args.quick) for e in checked]
    kinds = ["skipped" if k.startswith("skipped") else k.split(":")[0] for k in kinds]
    print(f"checking {len(checked)} entries as {here()}: "
          + ", ".join(f"{e.name} ({k})" for e, k in zip(checked, kinds)), flush=True)
    if args.jobs < 1:
        p.error(f"--jobs {args.jobs}: give at least 1")
    bad = [line for lines in check_all(checked, args.quick, args.jobs) for line in lines]
    for line in bad:
        print(f"MISMATCH {line}")
    by_interval = kinds.count("claims") + kinds.count("seeds")
    print(f"{len(checked)} entries: {kinds.count('exact')} exact, {by_interval} by interval "
          f"({kinds.count('claims')} claims, {kinds.count('seeds')} seed bands), {kinds.count('skipped')} skipped for "
          f"this kind of CPU ({here()}); {len(skipped)} not checked (frozen or nothing to compare); {len(bad)} "
          f"mismatches; took {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
