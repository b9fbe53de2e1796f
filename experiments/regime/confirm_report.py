"""Round 5's tables and figure from its run records: `python -m experiments.regime --confirm --report`.

  run_numbers(head, rows)     grid.run_row's numbers of one run, plus whether a fall came back (confirm.RECOVERED_TEXT)
                              and the share of tokens (sequences for MIS) its correction truncated or masked
  confirmation(done, pooled)  per setting: the rule's verdict (Fisher, Holm over the two settings) and the numbers
                              reported beside it, each with its 95 % interval; the pooled 32 seeds as secondary
  comparison(done)            per arm its numbers; every arm against none (family A) and against r3 (family B)
                              (each prediction's verdict: verdicts.compare, by rules fixed before the arms' runs)
  made_on_seeds(done, path)   per cell, the seeds each kind of CPU made (the record's header, else
                              made_on.json: experiments/made_on.py); description, beside HARDWARE_TEXT
  write(...)                  OUT/confirm.{json,md} and OUT/confirm.png
Everything is a function of the committed records (results/regime/confirm/records, and for the pooled numbers the
regime grid's results/regime/records of seeds 0-7, whose runs had the same flags).
"""
import json
import os
import statistics
import subprocess

from experiments.common import fmt, write_results
from experiments.made_on import kinds_lines
from experiments.regime import confirm, verdicts
from experiments.regime.grid import _mean, _paired, cell_run, run_row
from experiments.stats import fisher_exact, holm, newcombe, wilson
from experiments.sweep import finished

GRID_RECORDS = os.path.join("results", "regime", "records")  # the exploration's records (seeds 0-7)
HARDWARE_TEXT = (
    "description, not a test (added 2026-12-07, after 124 of round 5's 208 runs, when the machine changed kind; it "
    "changes no rule). This project's machine alternates between kinds of CPU, and a run's numbers depend on the "
    "kind, its warm-up's too (remade on each machine), so runs of one seed made on different kinds do not start from "
    "bit-identical checkpoints. Round 5's design does not fix the kind and its tests are unchanged; a difference of "
    "the collapse rate between kinds would show as a difference between the arms made on each. Where a record does "
    "not name its CPU, made_on.json says where it was read (experiments/made_on.py)")


def design_commit(design_file: str = "confirm.py") -> str | None:
    """The commit that added `design_file` of experiments/regime (the pre-registration: it must be older than every
    record or measurement it decides), from git."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), design_file)
    r = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", path], cwd=os.path.dirname(path),
                       capture_output=True, text=True)
    return r.stdout.split()[-1] if r.returncode == 0 and r.stdout.split() else None


def run_numbers(head: dict, rows: list[dict]) -> dict:
    out = run_row(head.get("commit"), rows)
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if r.get("eval/accuracy") is not None]
    came_back = None
    if out["collapse_step"] is not None and evals:
        best_before = max(a for s, a in evals if s <= out["collapse_step"])
        came_back = evals[-1][1] >= best_before - confirm.RECOVER_MARGIN
    share = [r.get("is/truncated_frac", r.get("is/masked_frac")) for r in rows]
    return dict(out, came_back=came_back, corrected_share=_mean(share))


def _cells(done: dict) -> dict:
    return {c: {s: run_numbers(*rec) for s, rec in runs.items()} for c, runs in done.items()}


def pooled_runs(cell: str, records: str = GRID_RECORDS) -> dict:
    """{seed: numbers} of the exploration's runs of `cell` (seeds 0-7) with exactly the flags of this round's."""
    out = {}
    for s in range(8):
        o, flags, steps = cell_run(cell, s, os.path.join("results", "regime", "runs"), confirm.STEPS)
        if os.path.isdir(records) and (rec := finished(o, flags, steps, records)) is not None:
            out[s] = run_numbers(*rec)
    return out


def pair(none: dict, r3: dict) -> dict:
    """none against r3 over the seeds each finished: counts, rates with Wilson intervals, the difference with
    Newcombe's interval, Fisher p; paired held-out area, largest drawdown, final trainer greedy accuracy."""
    kn, nn = sum(r["collapse_step"] is not None for r in none.values()), len(none)
    kr, nr = sum(r["collapse_step"] is not None for r in r3.values()), len(r3)
    out = dict(none=f"{kn}/{nn}", r3=f"{kr}/{nr}", n_none=nn, n_r3=nr, collapsed_none=kn, collapsed_r3=kr,
               p=fisher_exact(kn, nn, kr, nr) if nn and nr else 1.0)
    if nn and nr:
        out.update(rate_none=kn / nn, rate_none_ci=wilson(kn, nn), rate_r3=kr / nr, rate_r3_ci=wilson(kr, nr),
                   diff=kn / nn - kr / nr, diff_ci=newcombe(kn, nn, kr, nr))
    for key in ("heldout_area", "max_drawdown", "final_trainer_greedy"):
        effect, p, n, lo, hi = _paired(none, r3, key)
        out[key] = dict(effect=effect, p=p, pairs=n, lo=lo, hi=hi, none=_mean([r[key] for r in none.values()]),
                        r3=_mean([r[key] for r in r3.values()]))
    for arm, runs in (("none", none), ("r3", r3)):
        fell = [r for r in runs.values() if r["collapse_step"] is not None]
        out[f"came_back_{arm}"] = f"{sum(bool(r['came_back']) for r in fell)} of {len(fell)}"
    return out


def confirmation(cells: dict, pooled: dict) -> dict:
    rows = []
    for setting in confirm.CONFIRM_SETTINGS:
        none, r3 = cells.get(f"{setting}/none/n4", {}), cells.get(f"{setting}/r3/n4", {})
        rows.append(dict(setting=setting, **pair(none, r3),
                         pooled=pair({**pooled.get(f"{setting}/none/n4", {}), **none},
                                     {**pooled.get(f"{setting}/r3/n4", {}), **r3})))
    for r, q in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = q
        r["confirmed"] = bool(q < 0.05 and r["collapsed_none"] / max(r["n_none"], 1)
                              > r["collapsed_r3"] / max(r["n_r3"], 1))
    need = len(confirm.CONFIRM_SEEDS)
    complete = all(len(cells.get(c, {})) >= need for c in confirm.CONFIRM_CELLS)
    return dict(rows=rows, complete=complete, runs=sum(len(cells.get(c, {})) for c in confirm.CONFIRM_CELLS),
                total=need * len(confirm.CONFIRM_CELLS))


def arm_numbers(runs: dict) -> dict:
    k, n = sum(r["collapse_step"] is not None for r in runs.values()), len(runs)
    gn = [r["max_grad_norm"] for r in runs.values() if r["max_grad_norm"] is not None]
    mean = lambda key: _mean([r[key] for r in runs.values()])  # noqa: E731
    return dict(collapsed=k, n=n, rate=k / n if n else None, rate_ci=wilson(k, n) if n else None,
                heldout_area=mean("heldout_area"), max_drawdown=mean("max_drawdown"),
                median_max_grad_norm=statistics.median(gn) if gn else None, mean_kl=mean("mean_kl"),
                kl_trend=mean("kl_trend"), corrected_share=mean("corrected_share"),
                final_trainer_greedy=mean("final_trainer_greedy"))


def comparison(cells: dict) -> dict:
    seeds = set(confirm.COMPARE_SEEDS)
    arms = {a: {s: r for s, r in cells.get(f"{confirm.COMPARE_SETTING}/{a}/n4", {}).items() if s in seeds}
            for a in confirm.ARMS}
    tests = []
    for family, base in (("A", "none"), ("B", "r3")):
        for metric in ("collapsed", "heldout_area", "max_drawdown"):
            fam = []
            for a in confirm.ARMS:
                if a == base or (family == "B" and a == "none") or not arms[a] or not arms[base]:
                    continue
                if metric == "collapsed":
                    x, y = arm_numbers(arms[a]), arm_numbers(arms[base])
                    fam.append(dict(family=family, arm=a, base=base, metric=metric,
                                    p=fisher_exact(x["collapsed"], x["n"], y["collapsed"], y["n"]),
                                    effect=x["rate"] - y["rate"], counts=f"{x['collapsed']}/{x['n']} vs "
                                                                          f"{y['collapsed']}/{y['n']}"))
                else:
                    effect, p, n, lo, hi = _paired(arms[a], arms[base], metric)
                    fam.append(dict(family=family, arm=a, base=base, metric=metric, p=p, effect=effect, lo=lo,
                                    hi=hi, counts=f"{n} paired seeds"))
            for t, q in zip(fam, holm([t["p"] for t in fam])):
                t["p_holm"] = q
            tests += fam
    need = len(confirm.COMPARE_SEEDS)
    return dict(arms={a: arm_numbers(r) for a, r in arms.items()}, tests=tests,
                complete=all(len(r) >= need for r in arms.values()),
                runs=sum(len(r) for r in arms.values()), total=need * len(arms))


def _ci(x, ci, scale=100, spec=".0f") -> str:
    return "—" if x is None else f"{fmt(x, scale, spec=spec)} [{fmt(ci[0], scale, spec=spec)}, " \
                                 f"{fmt(ci[1], scale, spec=spec)}]"


def _paired_text(d: dict) -> str:
    return (f"{fmt(d['none'])} against {fmt(d['r3'])} (none - r3 {fmt(d['effect'])}"
            + ("" if d["lo"] is None else f" [{fmt(d['lo'])}, {fmt(d['hi'])}]") + f", p {d['p']:.3g})")


def report_md(data: dict) -> str:
    c, k = data["confirmation"], data["comparison"]
    status = "complete" if c["complete"] else f"**partial: {c['runs']} of {c['total']} runs finished**"
    made = sorted({r["commit"] for runs in data["cells"].values() for r in runs.values()} - {None})
    parts = [f"# Round 5: the confirmation on fresh seeds ({status})",
             f"Rule (fixed before any run, experiments/regime/confirm.py, added at commit "
             f"{(data['design_commit'] or 'unknown (no git)')[:10]}; the runs here ran at {', '.join(made) or '—'}): "
             f"{confirm.CONFIRM_RULE_TEXT}.",
             f"Collapse: {data['rule']}. Reported {confirm.CONFIRM_REPORT_TEXT.replace('(RECOVERED_TEXT)', '(next)')}. "
             f"Came back: {confirm.RECOVERED_TEXT}.",
             "| setting | no replay fell | R3 fell | rate none - r3 [Newcombe 95 %] | Fisher p | Holm p | confirmed |\n"
             "|---|---|---|---|---|---|---|\n" + "\n".join(
                 f"| {r['setting']} | {r['none']} ({_ci(r.get('rate_none'), r.get('rate_none_ci'))} %) | {r['r3']} "
                 f"({_ci(r.get('rate_r3'), r.get('rate_r3_ci'))} %) | {_ci(r.get('diff'), r.get('diff_ci'))} pts | "
                 f"{r['p']:.3g} | {r['p_holm']:.3g} | "
                 f"{('yes' if r['confirmed'] else 'no') if c['complete'] else 'pending (partial)'} |"
                 for r in c["rows"])]
    for r in c["rows"]:
        po = r["pooled"]
        parts.append(
            f"- **{r['setting']}**: held-out area {_paired_text(r['heldout_area'])}; largest drawdown "
            f"{_paired_text(r['max_drawdown'])}; the trainer's greedy held-out accuracy at the end "
            f"{_paired_text(r['final_trainer_greedy'])}; falls that came back: no replay {r['came_back_none']}, "
            f"R3 {r['came_back_r3']}. Pooled with the exploration's seeds 0-7 (secondary, not the test): no replay "
            f"{po['none']}, R3 {po['r3']} (Fisher p {po['p']:.3g}).")
    status = "complete" if k["complete"] else f"**partial: {k['runs']} of {k['total']} runs finished**"
    parts += [f"## The comparison at {confirm.COMPARE_SETTING} ({status}; seeds "
              f"{confirm.COMPARE_SEEDS[0]}-{confirm.COMPARE_SEEDS[-1]}; none and r3 are the confirmation's runs)",
              f"Tests (fixed before any run): {confirm.COMPARE_TESTS_TEXT}.",
              "| arm | flags | fell [Wilson 95 %] | held-out area | drawdown | median max grad norm | mean kl "
              "| kl trend | share corrected | prediction (below) |\n" + "|---" * 10 + "|\n" + "\n".join(
                  f"| {a} | `{' '.join(f'{n} {v}' for n, v in confirm.ARMS[a]) or '(base)'}` | "
                  f"{x['collapsed']}/{x['n']} ({_ci(x['rate'], x['rate_ci'])} %) | {fmt(x['heldout_area'])} | "
                  f"{fmt(x['max_drawdown'])} | {fmt(x['median_max_grad_norm'])} | {fmt(x['mean_kl'])} | "
                  f"{fmt(x['kl_trend'])} | {fmt(x['corrected_share'])} | "
                  f"{data['verdicts'].get(a, {}).get('verdict', '(base)')} |"
                  for a, x in k["arms"].items()),
              "| family | arm | against | metric | counts | effect (arm - base) [95 % t] | p | Holm p |\n"
              "|---|---|---|---|---|---|---|---|\n" + "\n".join(
                  f"| {t['family']} | {t['arm']} | {t['base']} | {t['metric']} | {t['counts']} | {fmt(t['effect'])}"
                  + ("" if t.get("lo") is None else f" [{fmt(t['lo'])}, {fmt(t['hi'])}]")
                  + f" | {t['p']:.3g} | {t['p_holm']:.3g} |" for t in k["tests"]),
              "## Predictions (written before the runs) and their verdicts",
              f"Verdicts by rules fixed before the comparison's runs (experiments/regime/verdicts.py): "
              f"{verdicts.KINDS_TEXT}. The confirmation's: {verdicts.CONFIRMATION_TEXT}.",
              f"- confirmation: {confirm.CONFIRM_PREDICTION}. {_verdict_text(data['verdicts']['confirmation'])}"]
    parts.append("\n".join(f"- {a}: {p}. {_verdict_text(data['verdicts'][a])}" for a, p in confirm.PREDICTIONS.items()))
    if data.get("made_on"):
        parts += ["## The kinds of CPU that made the runs", f"{data['hardware_text'][0].upper()}"
                  f"{data['hardware_text'][1:]}.",
                  kinds_lines(data["made_on"])]
    return "\n\n".join(parts)


def _verdict_text(v: dict) -> str:
    return f"**{v['verdict']}** ({v['why']})" + (f"; not tested: {v['not_tested']}" if v.get("not_tested") else "")


def made_on_seeds(done: dict, path: str | None) -> dict:
    """{cell: {cpu: [seeds]}} of the finished runs in `done` ({cell: {seed: (header, rows)}}): each run's CPU from
    its record's header, else from the made_on.json at `path`, else 'unknown'."""
    table = {}
    if path and os.path.exists(path):
        with open(path) as f:
            table = json.load(f)["records"]
    out = {}
    for c, runs in done.items():
        for s, (head, _) in sorted(runs.items()):
            cpu = head.get("cpu") or table.get(head.get("name"), {}).get("cpu") or "unknown"
            out.setdefault(c, {}).setdefault(cpu, []).append(s)
    return {c: dict(sorted(v.items())) for c, v in out.items()}


def write(done_confirm: dict, done_compare: dict, *, out: str, t0: float, records: str = GRID_RECORDS,
          made_on: str | None = None) -> dict:
    from experiments.regime import plots
    from experiments.regime.design import RULE_TEXT
    cells = _cells({**done_confirm, **done_compare})
    pooled = {c: pooled_runs(c, records) for c in confirm.CONFIRM_CELLS}
    data = dict(design_commit=design_commit(), rule_text=confirm.CONFIRM_RULE_TEXT, rule=RULE_TEXT,
                report_text=confirm.CONFIRM_REPORT_TEXT,
                recovered_text=confirm.RECOVERED_TEXT, tests_text=confirm.COMPARE_TESTS_TEXT,
                predictions=dict(confirm.PREDICTIONS, confirmation=confirm.CONFIRM_PREDICTION),
                confirmation=confirmation(cells, pooled), comparison=comparison(cells), cells=cells,
                hardware_text=HARDWARE_TEXT, made_on=made_on_seeds({**done_confirm, **done_compare}, made_on))
    data["verdicts"] = verdicts.compare(data["comparison"], data["confirmation"])
    data["verdict_rules"] = dict(kinds=verdicts.KINDS_TEXT, confirmation=verdicts.CONFIRMATION_TEXT)
    md = report_md(data)
    write_results(os.path.join(out, "confirm.json"), data, md=md, t0=t0)
    curves = {c: {s: [(r["step"], r["eval/accuracy"]) for r in rec[1] if r.get("eval/accuracy") is not None]
                  for s, rec in runs.items()} for c, runs in done_confirm.items()}
    plots.confirm_figure(data, curves, os.path.join(out, "confirm.png"))
    print(md)
    return data
