"""Where a cipher run's held-out accuracy plateaus, and why: the symbols whose mapping it has got stuck on.

  python -m experiments.staleness.plateaus RUN [RUN ...]
        # any cipher run folders (train.py --task cipher:N-N)
  python -m experiments.staleness.plateaus --save-inputs results/staleness
        # the grid's finished runs' late dumps, tokens only, into GRID/dumps/RUN.json.gz (kept; committed)
  python -m experiments.staleness.plateaus --grid results/staleness
        # the table from GRID/dumps and GRID/grid.json: GRID/plateaus.{json,md}, seconds

A cipher answer is exact only when every symbol of the prompt maps right, so a policy that maps a symbol wrong
fails every prompt that holds it. This reads a run's late sample dumps (RUN/samples/stepN, the last --last of them;
each is one GRPO group, 8 samples of one prompt) and calls a symbol stuck when the response mapped it wrong in at
least STUCK of its occurrences, in at least MIN_PROMPTS of the dumps' prompts. The cap k stuck symbols put on
held-out accuracy is the share of the run's own held-out prompts (r3.train.evaluate.heldout_examples, the same for every
run of a task) that hold none of them; (1 - k/64)^n is that share in expectation, for n symbols drawn with
replacement.

Exploratory, written at 40 of 120 grid runs after the plateaus were seen; not part of any pre-registered rule. The
run folders are not committed, so `--save-inputs` keeps what the table needs from them (the tokens of each run's
last dumps, a few kB a run) beside the grid's records; `--grid` reads only those and grid.json, so a clean clone
remakes the table (experiments.reproduce checks it).
"""
import argparse
import gzip
import json
import os
import re
import statistics
import time
from collections import Counter

from experiments.common import fmt, write_results
from experiments.staleness.design import cell_run
from r3.rollout.batch import load_batch
from r3.errors import InputError, run_main
from r3.runs.io import atomic_write
from r3.train.evaluate import heldout_examples
from r3.tasks.tasks import EOS, SYMBOL0, SYMBOLS, Cipher, make_task

STUCK = 0.9       # a symbol is stuck when the response got it wrong in at least this share of its occurrences
MIN_PROMPTS = 2   # ... and it occurred in at least this many of the dumps' prompts (a dump is one prompt's group)


def cap(k: int, n: int) -> float:
    """The exact-match ceiling with k stuck symbols and n-symbol prompts drawn with replacement."""
    return (1 - k / SYMBOLS) ** n


def dumps(run: str, last: int) -> list[str]:
    folder = os.path.join(run, "samples")
    steps = sorted((int(m.group(1)), d) for d in (os.listdir(folder) if os.path.isdir(folder) else [])
                   if (m := re.fullmatch(r"step(\d+)", d)))
    if not steps:
        raise InputError(f"{run}: no sample dumps (samples/stepN, written by train.py --dump-every)")
    return [os.path.join(folder, d) for _, d in steps[-last:]]


def symbols(prompt: list[int]) -> list[int]:
    """The cipher symbols (indices 0-63) of a prompt, in order."""
    return [t - SYMBOL0 for t in prompt if SYMBOL0 <= t < SYMBOL0 + SYMBOLS]


def symbol_errors(tokens: list[list[int]], Lp: int) -> tuple[Counter, Counter, int, int]:
    """(occurrences, wrong) per symbol index, exact rows (EOS after the last symbol included), rows, over one dump of
    a cipher batch (prompt length Lp, the '=' included)."""
    seen, wrong, exact = Counter(), Counter(), 0
    for row in tokens:
        syms, resp = symbols(row[:Lp]), row[Lp:]
        ok = len(resp) > len(syms) and resp[len(syms)] == EOS
        for i, s in enumerate(syms):
            seen[s] += 1
            if i >= len(resp) or resp[i] != SYMBOL0 + Cipher.PI[s]:
                wrong[s] += 1
                ok = False
        exact += ok
    return seen, wrong, exact, len(tokens)


def eval_cap(task: str, n: int, stuck: list[int]) -> float | None:
    """The share of the task's first n held-out prompts (what train.py --eval-prompts n scores) holding none of
    `stuck`: the best held-out accuracy a run stuck on them can reach."""
    prompts = [set(symbols(e.prompt)) for e in heldout_examples(make_task(task), n)]
    return sum(not p & set(stuck) for p in prompts) / len(prompts) if prompts else None


def extract(run: str, last: int) -> dict:
    """What the table needs from a run folder: its task and the tokens (and prompt length) of its last dumps."""
    try:
        with open(os.path.join(run, "args.json")) as f:
            args = json.load(f)
        task, eval_prompts = args["task"], args["eval_prompts"]
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"{run}: no readable args.json with a task and eval_prompts ({e})") from None
    out = []
    for d in dumps(run, last):
        b = load_batch(d)
        if b.meta.get("prompt_len") is None:
            raise InputError(f"{d}: a sample dump without meta['prompt_len']: not a train.py dump")
        out.append(dict(dump=os.path.basename(d), prompt_len=b.meta["prompt_len"], tokens=b.tokens.tolist()))
    return dict(run=os.path.basename(os.path.normpath(run)), task=task, eval_prompts=eval_prompts, dumps=out)


def analyse(inp: dict, best: float | None, last: float | None, fell: bool | None = None) -> dict:
    """The stuck symbols of one run's dumps (`extract`), beside its best and last held-out accuracy; `fell`: whether
    the run collapsed (the grid's rule; None when not known)."""
    m = re.fullmatch(r"cipher:(\d+)-(\d+)", inp["task"])
    if not m or m.group(1) != m.group(2):
        raise InputError(f"{inp['run']}: task {inp['task']!r}; this reads cipher runs with one prompt length "
                         "(cipher:N-N)")
    seen, wrong, prompts, exact, rows = Counter(), Counter(), Counter(), 0, 0
    for d in inp["dumps"]:
        s, w, e, r = symbol_errors(d["tokens"], d["prompt_len"])
        seen.update(s), wrong.update(w), prompts.update(set(s))
        exact, rows = exact + e, rows + r
    stuck = sorted(s for s in seen if prompts[s] >= MIN_PROMPTS and wrong[s] >= STUCK * seen[s])
    return dict(run=inp["run"], task=inp["task"], fell=fell, dumps=[d["dump"] for d in inp["dumps"]], rows=rows,
                exact_rows=exact / rows if rows else None, stuck=stuck, stuck_prompts=[prompts[s] for s in stuck],
                cap=eval_cap(inp["task"], inp["eval_prompts"], stuck), cap_expected=cap(len(stuck), int(m.group(1))),
                other_errors=sum(wrong[s] for s in wrong if s not in stuck),
                best_heldout=best, last_heldout=last)


def read_run(run: str, last: int) -> dict:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        acc = [a for line in f if line.strip() and (a := json.loads(line).get("eval/accuracy")) is not None]
    return analyse(extract(run, last), max(acc) if acc else None, acc[-1] if acc else None)


def input_path(grid: str, run: str) -> str:
    return os.path.join(grid, "dumps", run + ".json.gz")


def save_input(grid: str, run: str, last: int = 8) -> bool:
    """GRID/dumps/RUN.json.gz for one finished run folder, unless it is there (gzip without a time stamp). Returns
    whether it wrote one."""
    d = os.path.basename(os.path.normpath(run))
    if not os.path.exists(os.path.join(run, "done.json")) or os.path.exists(input_path(grid, d)):
        return False
    text = json.dumps(extract(run, last)).encode()
    os.makedirs(os.path.dirname(input_path(grid, d)), exist_ok=True)

    def write(tmp):
        with open(tmp, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as g:
            g.write(text)
    atomic_write(input_path(grid, d), write)
    return True


def keep_input(grid: str, run: str) -> bool:
    """experiments.staleness calls this as each grid run finishes, so a run's dumps are kept before its folder can
    go (23 runs' were lost with a checkout): a cipher run's input is written; another task's run has none to keep;
    a cipher run whose input cannot be made is named in a note, and the grid goes on."""
    try:
        with open(os.path.join(run, "args.json")) as f:
            if not str(json.load(f).get("task", "")).startswith("cipher"):
                return False
        return save_input(grid, run)
    except (OSError, ValueError, InputError) as e:
        print(f"note: {run}: plateau input not kept ({e}); make it with --save-inputs {grid}")
        return False


LEFT_BY_WRITERS = (".tmp", ".old", ".clear")  # a run folder set aside by r3.runs.io / RunFolder.clear, not a run


def save_inputs(grid: str, last: int) -> list[str]:
    """GRID/dumps/RUN.json.gz for every finished run in GRID/runs that has none yet."""
    root = os.path.join(grid, "runs")
    if not os.path.isdir(root):  # a clean clone: the committed inputs are all there is
        print(f"note: {root} does not exist here; the kept inputs in {os.path.join(grid, 'dumps')} stand as they are")
        return []
    return [d for d in sorted(os.listdir(root)) if not d.endswith(LEFT_BY_WRITERS)
            and save_input(grid, os.path.join(root, d), last)]


def read_grid(grid: str) -> tuple[list[dict], list[str]]:
    """The table's rows from GRID/dumps and GRID/grid.json, and the runs grid.json holds that have no kept input (their
    run folders went before --save-inputs read them), which the table cannot show."""
    folder = os.path.join(grid, "dumps")
    names = sorted(f[:-len(".json.gz")] for f in (os.listdir(folder) if os.path.isdir(folder) else [])
                   if f.endswith(".json.gz"))
    if not names:
        raise InputError(f"{folder}: no inputs; make them with --save-inputs {grid} where the run folders are")
    res, runs = [], grid_runs(grid)
    for name in names:
        try:
            with gzip.open(input_path(grid, name), "rt") as f:
                inp = json.load(f)
        except (OSError, EOFError, ValueError) as e:
            raise InputError(f"{input_path(grid, name)}: not a readable input ({e}); remake it with "
                             f"--save-inputs") from None
        r = runs.get(name)
        res.append(analyse(inp, *((r["best_heldout"], r["final_heldout"], r["collapse_step"] is not None) if r
                                  else (None, None, None))))
    return res, sorted(set(runs) - set(names))


def grid_runs(grid: str) -> dict:
    """Run folder name -> its entry in GRID/grid.json (collapse step, best and final held-out...); {} without one."""
    path = os.path.join(grid, "grid.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            g = json.load(f)
        return {os.path.basename(cell_run(c, int(s), g["lr"], "")[0]): r
                for c, d in g["cells"].items() if not d.get("alias_of") for s, r in d["runs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{path}: not a readable experiments.staleness grid.json ({type(e).__name__}: {e})") \
            from None


def table(res: list[dict]) -> str:
    lines = ["| run | fell | best held-out | last held-out | exact rows in the dumps | stuck symbols (prompts) | "
             "cap on its held-out prompts | (1 - k/64)^n | other wrong positions |", "|---" * 9 + "|"]
    lines += [f"| {r['run']} | {'—' if r['fell'] is None else 'yes' if r['fell'] else 'no'} | "
              f"{fmt(r['best_heldout'])} | {fmt(r['last_heldout'])} | {fmt(r['exact_rows'])} | "
              f"{', '.join(f'{s} ({n})' for s, n in zip(r['stuck'], r['stuck_prompts'])) or '—'} | {fmt(r['cap'])} | "
              f"{fmt(r['cap_expected'])} | {r['other_errors']} |" for r in res]
    return "\n".join(lines)


def summary(res: list[dict], missing: list[str] = ()) -> str:
    """The runs that did not collapse, by their count of stuck symbols: how many, the expected cap, how far their best
    held-out sits from their own cap; the fallen runs apart; and symbols stuck in several runs of one seed."""
    def spread(xs):
        xs = sorted(x for x in xs if x is not None)
        return f"{fmt(xs[0])}, {fmt(statistics.median(xs))}, {fmt(xs[-1])}" if xs else "—"
    stable = [r for r in res if r["fell"] is False]
    lines = ["| stuck symbols | runs (not collapsed) | (1 - k/64)^n | best held-out: min, median, max | best held-out "
             "- cap on its held-out prompts: min, median, max |", "|---|---|---|---|---|"]
    for k in sorted({len(r["stuck"]) for r in stable}):
        rs = [r for r in stable if len(r["stuck"]) == k]
        lines.append(f"| {k} | {len(rs)} | {fmt(rs[0]['cap_expected'])} | {spread(r['best_heldout'] for r in rs)} | "
                     + spread(r["best_heldout"] - r["cap"] for r in rs if r["best_heldout"] is not None) + " |")
    fallen = [r for r in res if r["fell"]]
    by_seed = {}
    for r in res:
        seed = re.search(r"-s(\d+)$", r["run"])
        for sym in r["stuck"]:
            by_seed.setdefault((seed.group(1) if seed else "?", sym), []).append(r["run"])
    shared = [f"symbol {sym} in {len(runs)} runs of seed {seed}" for (seed, sym), runs in sorted(
        by_seed.items(), key=lambda kv: (-len(kv[1]), kv[0])) if len(runs) > 1]
    unknown = sum(r["fell"] is None for r in res)
    return ("\n".join(lines) + f"\n\nRuns that collapsed (the grid's rule), not in the table above: {len(fallen)}" +
            (" (" + "; ".join(f"{r['run']}: {len(r['stuck'])} stuck" for r in fallen) + ")" if fallen else "") +
            "." + (f" Runs grid.json does not hold, not in the table either: {unknown}." if unknown else "") +
            (f" Runs grid.json holds whose dumps were not kept (their run folders went before --save-inputs read "
             f"them), not in the table either: {len(missing)} ({', '.join(missing)})." if missing else "") +
            "\n\nStuck in more than one run of a seed: " + ("; ".join(shared) or "none") + ".")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="cipher run folders")
    p.add_argument("--grid", default=None, help="the table of a grid's runs from GRID/dumps and GRID/grid.json")
    p.add_argument("--save-inputs", default=None, metavar="GRID",
                   help="write GRID/dumps/RUN.json.gz for the finished runs in GRID/runs that have none")
    p.add_argument("--last", type=int, default=8, help="read the last N sample dumps of each run")
    p.add_argument("--out", default=None, help="write OUT/plateaus.{json,md} (default with --grid: GRID)")
    args = p.parse_args(argv)
    if args.last < 1:
        p.error("--last must be >= 1")
    if sum(map(bool, (args.runs, args.grid, args.save_inputs))) != 1:
        p.error("name run folders, or --grid GRID, or --save-inputs GRID (one of them)")
    return args


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    if args.save_inputs:
        written = save_inputs(args.save_inputs, args.last)
        print(f"{len(written)} inputs written to {os.path.join(args.save_inputs, 'dumps')}" +
              (f": {', '.join(written)}" if written else ""))
        return
    res, missing = read_grid(args.grid) if args.grid else ([read_run(r, args.last) for r in args.runs], [])
    md = (f"Exploratory: the symbols each cipher run maps wrong in at least {STUCK:.0%} of their occurrences, in at "
          f"least {MIN_PROMPTS} of the prompts of its last sample dumps, beside its held-out accuracy and the cap "
          f"they put on it: the share of its held-out prompts holding none of them.\n\n" + summary(res, missing) +
          "\n\n" + table(res))
    print(md)
    out = args.out or args.grid
    if out:
        write_results(os.path.join(out, "plateaus.json"), dict(stuck_share=STUCK, min_prompts=MIN_PROMPTS, runs=res,
                                                                   without_inputs=missing),
                      t0=t0, md=md)


if __name__ == "__main__":
    run_main(main)
