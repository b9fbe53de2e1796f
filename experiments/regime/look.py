"""A short look at round 5's phenomenon on this machine: `python -m experiments.regime --look` (issue 49, item 4).

One seed pair of the confirmation (no replay and its R3 twin, chosen by PAIR_RULE_TEXT, or --seeds), run here for as
many steps as show the committed fall (STEPS_RULE_TEXT, or --steps), drawn over the committed curves of the same seeds
with every other committed run of the cell in grey; printed beside it, the collapse rate over all the confirmation's
finished seeds at the setting, so that a chosen pair is never read as the rate. Runs are deterministic per kind of CPU
(one thread, seeded; docs/reproduce.md), so on the kind that made the records, at code that computes what the records'
commit did, the first N rows equal the committed ones: the look compares every metric the record keeps, step by step,
and says whether they did. The pair is the earliest fall, not the lowest seed that fell, so that the look runs as few
steps as the rule allows (the 15 minutes of issue 49); the printout names it as chosen and puts the rate beside it.

  committed_runs(setting, records)   {arm: {seed: (header, rows)}} of the confirmation's finished runs at SETTING
  default_seed(committed)            PAIR_RULE_TEXT: (seed, why)
  steps_for(collapse_step)           STEPS_RULE_TEXT: (steps, why)
  choose(committed, setting, ...)    the seeds and steps, by the rules or as --seeds / --steps named them
  compare_rows(committed, here)      same, or the first (step, key) that differs, and the largest |difference|
  readout(committed, todo, steps)    the printed verdicts and comparisons; rate_line: the rate over all finished seeds
  main(args, t0)                     run (experiments.sweep.run_all, resumable), print, OUT/look.{json,md,png}
A run stopped at step N makes the first N rows of the 800-step run: --steps changes nothing before it (the
learning rate warms up over --lr-warmup steps and is then constant; the warm-up is keyed by --warmup-steps; a
held-out evaluation at the last step coincides with the every-50 one, which is why N is a multiple of 50).
Left out on purpose: the comparison arms, and any claim from the local pair: the rate is the records'.
"""
import json
import math
import os

from experiments.common import fmt, write_results
from experiments.regime import confirm
from experiments.regime.confirm_report import run_numbers
from experiments.regime.confirm_run import arm_run
from experiments.rules import sustained_collapse
from experiments.stats import wilson
from experiments.sweep import RECORD_DROP, _round, read_record, reached, record_path, run_all, same_command
from r3.errors import InputError
from r3.runs.io import read_jsonl

EVERY = 50  # the confirmation's --eval-every: held-out accuracy is read at steps 49, 99, ...
MARGIN = 100  # steps run past the evaluation at which the committed no-replay run fell: the rule's second evaluation
NO_FALL_STEPS = 400  # when no committed no-replay run at the setting fell yet: half a run, to stay near 15 minutes
# An estimate, not measured here: one run on an idle core, fidelity and evaluations included. docs/confirm.md measured
# 1335 s for 800 steps with two runs beside two other busy processes on 2 cores, about twice an idle machine's.
SECONDS_PER_STEP = 0.85
PAIR_RULE_TEXT = ("the confirmation seed at the setting whose committed no-replay run fell earliest by the "
                  "sustained-collapse rule (ties: the lowest seed), with its R3 twin; if none fell yet, the lowest "
                  "seed whose two arms both finished. Only seeds with both arms' records count")
STEPS_RULE_TEXT = (f"the committed no-replay run's collapse step rounded up to the next evaluation (every {EVERY}), "
                   f"plus {MARGIN} (the rule needs a second evaluation), at most {confirm.STEPS}; {NO_FALL_STEPS} "
                   f"when it did not fall. With several seeds, the most any of them needs")


def committed_runs(setting: str, records: str) -> dict:
    """{"none"|"r3": {seed: (header, rows)}} of the confirmation's records at SETTING whose flags are the run's.
    Read from the records alone, never from a run folder (a look's short runs are not the confirmation's)."""
    out = {"none": {}, "r3": {}}
    for arm in out:
        for s in confirm.CONFIRM_SEEDS:
            run, flags, steps = arm_run(f"{setting}/{arm}/n4", s, "runs")
            path = record_path(run, records)
            if os.path.exists(path):
                head, rows = read_record(path)
                if same_command(head["flags"], flags) and reached(head["done"], steps):
                    out[arm][s] = (head, rows)
    return out


def default_seed(committed: dict) -> tuple[int, str]:
    both = sorted(set(committed["none"]) & set(committed["r3"]))
    if not both:
        raise InputError("no seed of the confirmation has both arms' records at this setting yet; nothing to look at")
    fell = [(sustained_collapse(committed["none"][s][1])[0], s) for s in both]
    fell = sorted((x, s) for x, s in fell if x is not None)
    if fell:
        x, s = fell[0]
        return s, f"its no-replay run fell earliest ({len(fell)} of {len(both)} finished seeds fell), at step {x}"
    return both[0], f"no committed no-replay run fell yet ({len(both)} finished seeds): the lowest finished seed"


def steps_for(collapse_step: int | None) -> tuple[int, str]:
    if collapse_step is None:
        return NO_FALL_STEPS, f"its no-replay run did not fall in {confirm.STEPS} steps: {NO_FALL_STEPS}"
    n = min(confirm.STEPS, EVERY * math.ceil((collapse_step + 1) / EVERY) + MARGIN)
    return n, f"its no-replay run fell at step {collapse_step}: the evaluation there, plus {MARGIN}, at most " \
              f"{confirm.STEPS}: {n}"


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)  # NaN is NaN


def compare_rows(committed: list[dict], here: list[dict]) -> dict:
    """Every metric of every step both hold, as the record keeps it (7 significant digits, RECORD_DROP dropped):
    same (bool), the first difference (step, key, committed, here) and the largest |difference| of a number."""
    first, biggest, n = None, 0.0, 0
    for a, b in zip(committed, [_round({k: v for k, v in r.items() if k not in RECORD_DROP}) for r in here]):
        for k in sorted(set(a) | set(b)):
            x, y = a.get(k, "(absent)"), b.get(k, "(absent)")
            n += 1
            if not _same(x, y):
                first = first or dict(step=a.get("step"), key=k, committed=x, here=y)
                nums = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
                biggest = max(biggest, abs(x - y) if nums and math.isfinite(x - y) else math.inf)
    if len(committed) != len(here):
        first = first or dict(step=min(len(committed), len(here)), key="(rows)", committed=len(committed),
                              here=len(here))
    return dict(same=first is None, first=first, max_abs_diff=biggest, values=n, steps=min(len(committed), len(here)))


def _verdict(rows: list[dict], steps: int, came_back: bool | None = None) -> str:
    x, why = sustained_collapse(rows)
    back = {None: "", True: f", and came back by its end (within {confirm.RECOVER_MARGIN} of its best before)",
            False: ", not back by its end"}
    return f"held over {steps} steps" if x is None else f"fell at step {x} ({why}){back[came_back]}"


def rate_line(setting: str, committed: dict) -> tuple[str, dict]:
    k = {a: sum(sustained_collapse(r)[0] is not None for _, r in runs.values()) for a, runs in committed.items()}
    n = {a: len(runs) for a, runs in committed.items()}
    ci = {a: wilson(k[a], n[a]) for a in k}
    pct = lambda a: f"{fmt(ci[a][0], 100, spec='.0f')}, {fmt(ci[a][1], 100, spec='.0f')}"  # noqa: E731
    line = (f"over all {n['none']} finished confirmation seeds at {setting} (the rate; the pair above is one seed, "
            f"chosen by the rule): no replay fell on {k['none']} of {n['none']} (Wilson 95 % [{pct('none')}] %), R3 "
            f"on {k['r3']} of {n['r3']} ([{pct('r3')}] %); the confirmation runs {len(confirm.CONFIRM_SEEDS)} seeds "
            f"per cell, results/regime/confirm/confirm.md holds its tables")
    return line, dict(fell=k, n=n, wilson=ci)


def _json(path: str, default):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def _local(out: str) -> tuple[list[dict], dict]:
    """A look's run: its metrics rows and its provenance (commit, CPU)."""
    return read_jsonl(os.path.join(out, "metrics.jsonl")), _json(os.path.join(out, "provenance.json"), {})


def choose(committed: dict, setting: str, seeds: list[int] | None, steps: int | None) -> tuple:
    """(seeds, why those, steps, why that many): the rules, or what --seeds / --steps named (refused on one line
    when a named seed lacks a committed record of either arm)."""
    if seeds is None:
        seed, why = default_seed(committed)
        seeds, pick = [seed], f"seed {seed}, by the rule ({PAIR_RULE_TEXT}): {why}"
    else:
        have = sorted(set(committed["none"]) & set(committed["r3"]))
        for s in seeds:
            if missing := [a for a in ("none", "r3") if s not in committed[a]]:
                raise InputError(f"--seeds {s}: no committed record of {' and '.join(missing)} at {setting}; seeds "
                                 f"with both: {' '.join(map(str, have)) or 'none yet'}")
        seeds, pick = list(dict.fromkeys(seeds)), f"seeds {' '.join(map(str, seeds))}, named by --seeds"
    if steps is not None:
        return seeds, pick, steps, "named by --steps"
    need = {s: steps_for(sustained_collapse(committed["none"][s][1])[0]) for s in seeds}
    s = max(need, key=lambda s: need[s][0])
    return seeds, pick, need[s][0], f"by the rule ({STEPS_RULE_TEXT}): seed {s}: {need[s][1]}"


def readout(committed: dict, todo: list[tuple], steps: int) -> tuple[list[str], list[dict]]:
    """The printed lines per run (committed verdict over its 800 steps, this machine's over its N) and the
    comparison of each run's rows with the committed run's first N."""
    lines, runs = [], []
    for s, arm, out, _, _ in todo:
        rows, prov = _local(out)
        head, full = committed[arm][s]
        name = "no replay" if arm == "none" else "R3"
        back = run_numbers(head, full)["came_back"]
        lines.append(f"seed {s}, {name}: committed {_verdict(full, len(full), back)}; here {_verdict(rows, len(rows))}")
        runs.append(dict(seed=s, arm=arm, committed_commit=head.get("commit"), here_commit=prov.get("commit"),
                         cpu=prov.get("cpu"), **compare_rows(full[:steps], rows[:steps])))
    for r in runs:
        f = r["first"]
        lines.append(f"same as committed, seed {r['seed']} {r['arm']}: " + (
            f"yes (every metric the record keeps, {r['values']} values over steps 0-{r['steps'] - 1})" if r["same"]
            else f"no: first at step {f['step']}, {f['key']}: committed {f['committed']}, here {f['here']}; max "
                 f"|difference| {fmt(r['max_abs_diff'])}"))
    if not all(r["same"] for r in runs):
        lines.append(f"runs repeat bit for bit only on the kind of CPU that made them, at the same code "
                     f"(docs/reproduce.md): committed at {runs[0]['committed_commit']}, here at "
                     f"{runs[0]['here_commit']} on {runs[0]['cpu']}; the records do not name their CPU")
    return lines, runs


def main(args, t0: float) -> dict:
    from experiments.regime import plots
    committed = committed_runs(args.setting, args.records)
    seeds, pick, steps, steps_why = choose(committed, args.setting, args.seeds, args.steps)
    runs_dir = args.runs_dir or os.path.join(args.out, "runs")
    todo = [(s, arm, *arm_run(f"{args.setting}/{arm}/n4", s, runs_dir)) for s in seeds for arm in ("none", "r3")]
    minutes = math.ceil(len(todo) / args.jobs) * steps * SECONDS_PER_STEP / 60
    print(f"look at {args.setting}: {pick}\nsteps: {steps}, {steps_why}\ntime, an estimate: about {minutes:.0f} min "
          f"for {len(todo)} runs, {args.jobs} at a time ({SECONDS_PER_STEP} s a step on an idle core), plus the "
          f"start-matched warm-up of a seed not yet in .cache/warmup", flush=True)
    for _, _, out, flags, _ in todo:  # a folder is only ever extended (experiments.sweep): refuse a shorter look
        saved = _json(os.path.join(out, "sweep_flags.json"), None)
        if saved and same_command(saved, flags) and int(saved[-1]) > steps:
            raise InputError(f"{out} holds a {saved[-1]}-step look; pass --steps {saved[-1]} or remove it")
    run_all([(out, flags, steps) for _, _, out, flags, _ in todo], jobs=args.jobs,
            log_dir=os.path.join(runs_dir, "logs"))
    lines, runs = readout(committed, todo, steps)
    same = all(r["same"] for r in runs)
    lines.append(f"same as committed: {'yes' if same else 'no'} (max |difference| over the {steps} steps run, every "
                 f"metric: {fmt(max(r['max_abs_diff'] for r in runs))})")
    rate, counts = rate_line(args.setting, committed)
    lines.append(rate)
    print("\n".join(lines))
    data = dict(setting=args.setting, seeds=seeds, pick=pick, pair_rule=PAIR_RULE_TEXT, steps=steps,
                steps_why=steps_why, steps_rule=STEPS_RULE_TEXT, same=same, runs=runs, rate=counts, lines=lines)
    write_results(os.path.join(args.out, "look.json"), data, md="\n\n".join(
        [f"# A look at {args.setting}: {pick}", f"steps: {steps}, {steps_why}", *lines]), t0=t0)
    curves = {arm: {s: rec[1] for s, rec in committed[arm].items()} for arm in ("none", "r3")}
    here = {(s, arm): _local(out)[0] for s, arm, out, _, _ in todo}
    plots.look_figure(args.setting, curves, here, steps, os.path.join(args.out, "look.png"))
    print(f"figure: {os.path.join(args.out, 'look.png')}")
    return data
