"""The levers: their rows, and the grid levers.py pre-registers (`python -m experiments.regime --levers ...`).

  grid_run(cell, seed, runs_dir)   (run folder, train.py flags, steps) of one grid run: natural-clip/none/n4 of the
                                   regime grid (design.COMMON + design.CLIP_FLAGS) with --is-cap 2, the setting's lever
                                   (--rollout-lag K, or --preset P --rollout-dtype int4) and the arm's flags
  plan(rows, runs_dir, seeds)      every run of the grid, seed-major; refused until the rows decide its two rules
  extended(cells)                  EXTEND_TEXT: the settings whose cells go on to seeds 40-47
  grid_tests(cells)                TESTS_TEXT: both families, Fisher and paired permutations, Holm
Runs are the sweep's (experiments/sweep.py): resumable, one record per finished run in OUT/records, from which the
grid's tables and figure are made (OUT/grid.{json,md,png}). OUT is results/regime/levers.
"""
import os

from experiments.common import fmt, write_results
from experiments.made_on import kinds_lines
from experiments.regime import design, levers, verdicts
from experiments.regime.grid import _paired, cell_entry, cell_run, run_row
from experiments.stats import fisher_exact, holm, wilson
from experiments.sweep import finished, run_all, set_flag
from r3.errors import InputError


HARDWARE_TEXT = (
    "Description, not a test (added before the grid's first run): this project's machine alternates between kinds of "
    "CPU and a run's numbers depend on the kind, its warm-up's included, so two cells' runs of one seed made on "
    "different kinds do not start from one checkpoint; the design fixes no kind and its tests are unchanged. Each "
    "record's header names the CPU that made it")


def setting_flags(setting: str, flags: list[str]) -> list[str]:
    """`flags` with the lever of SETTING: lagK-clip or PRESET-int4-clip."""
    lever = setting.removesuffix("-clip")
    if setting == lever:
        raise ValueError(f"{setting!r}: every lever grid setting runs the clipped update (-clip)")
    if lever.startswith("lag") and lever[3:].isdigit():
        return set_flag(flags, "--rollout-lag", lever[3:])
    if lever in levers.LOWBIT_ROWS:
        preset, dtype = levers.LOWBIT_ROWS[lever]
        return set_flag(set_flag(flags, "--preset", preset), "--rollout-dtype", dtype)
    raise ValueError(f"unknown lever setting {setting!r}")


def grid_run(cell: str, seed: int, runs_dir: str) -> tuple[str, list[str], int]:
    setting, arm, n = cell.split("/")
    if arm not in levers.ARMS:
        raise ValueError(f"unknown arm {arm!r} in {cell!r}; choose from {', '.join(levers.ARMS)}")
    _, flags, _ = cell_run(f"natural-clip/none/{n}", seed, runs_dir, levers.STEPS)
    flags = setting_flags(setting, set_flag(flags, "--is-cap", levers.IS_CAP))
    for name, value in levers.ARMS[arm]:
        flags = set_flag(flags, name, value)
    return os.path.join(runs_dir, f"{setting}-{arm}-{n}-s{seed}"), flags, levers.STEPS


def decided(rows: dict) -> tuple[int, str]:
    """(K*, the int4 preset) from rows.json's data; InputError while either rule is undecided."""
    if rows.get("k_star") is None or rows.get("int4_preset") is None:
        raise InputError(f"the lever grid needs both rules decided from complete rows (K*: {rows.get('k_star')}, "
                         f"int4 preset: {rows.get('int4_preset')}; {rows.get('int4_why')}): run `python -m "
                         f"experiments.regime --levers` and commit its measurements first")
    return rows["k_star"], rows["int4_preset"]


def plan(rows: dict, runs_dir: str, seeds) -> list[tuple[str, int, str, list[str], int]]:
    """(cell, seed, run folder, flags, steps) of every run of `seeds`, seed-major."""
    k_star, preset = decided(rows)
    cells = levers.grid_cells(k_star, preset)
    return [(c, s, *grid_run(c, s, runs_dir)) for s in seeds for c in cells]


def pairs(cells: list[str]) -> list[tuple[str, str, str]]:
    """(family, a, b) of TESTS_TEXT among `cells`, a predicted to fall more."""
    out = []
    for setting in dict.fromkeys(c.split("/")[0] for c in cells):
        has = lambda arm: f"{setting}/{arm}/n4" in cells  # noqa: E731
        c = lambda arm: f"{setting}/{arm}/n4"  # noqa: E731
        out += [("A", c("none"), c("r3"))] if has("none") and has("r3") else []
        out += [("B", c("none"), c("tis"))] if has("none") and has("tis") else []
        out += [("B", c("tis"), c("r3"))] if has("tis") and has("r3") else []
        out += [("B", c("r3"), c("r3-tis"))] if has("r3") and has("r3-tis") else []
        out += [("B", c("none"), c("r3-tis"))] if has("none") and has("r3-tis") else []
    return out


def grid_tests(cells: dict) -> list[dict]:
    """Every pair's three tests, Holm within (family, metric)."""
    res = []
    for family, a, b in pairs(list(cells)):
        ca, cb = cells[a], cells[b]
        if not ca["n"] or not cb["n"]:
            continue
        res.append(dict(family=family, a=a, b=b, metric="collapsed", effect=ca["collapsed"] / ca["n"] -
                        cb["collapsed"] / cb["n"], p=fisher_exact(ca["collapsed"], ca["n"], cb["collapsed"], cb["n"]),
                        counts=f"{ca['collapsed']}/{ca['n']} vs {cb['collapsed']}/{cb['n']}"))
        for key in ("heldout_area", "max_drawdown"):
            effect, p, n, lo, hi = _paired(ca["runs"], cb["runs"], key)
            res.append(dict(family=family, a=a, b=b, metric=key, p=p, effect=effect, lo=lo, hi=hi,
                            counts=f"{n} paired seeds"))
    for fam in ("A", "B"):
        for metric in ("collapsed", "heldout_area", "max_drawdown"):
            group = [t for t in res if t["family"] == fam and t["metric"] == metric]
            for t, q in zip(group, holm([t["p"] for t in group])):
                t["p_holm"] = q
    for t in res:
        t["r3_holds"] = (t["family"] == "A" and t["metric"] == "collapsed" and t["p_holm"] < 0.05 and t["effect"] > 0)
    return res


def extended(cells: dict, seeds=levers.GRID_SEEDS, planned_cells: list[str] | None = None) -> list[str]:
    """EXTEND_TEXT: the settings whose every cell (every one of `planned_cells` there, when given) finished `seeds`
    and one of whose pairs separates there."""
    names = list(planned_cells) if planned_cells is not None else list(cells)
    out = []
    for setting in dict.fromkeys(c.split("/")[0] for c in names):
        mine = [c for c in names if c.startswith(setting + "/")]
        if not all(c in cells and set(seeds) <= set(cells[c]["runs"]) for c in mine):
            continue
        first = {c: cell_entry({s: cells[c]["runs"][s] for s in seeds}) for c in mine}
        for t in grid_tests(first):
            if (t["metric"] == "collapsed" and abs(t["effect"]) * len(seeds) >= 2 - 1e-9) or \
                    (t["metric"] == "heldout_area" and t["p"] < 0.1):
                out.append(setting)
                break
    return out


def collect(runs: list[tuple], records: str, curves: dict | None = None, made: dict | None = None) -> dict:
    """{cell: cell_entry} of the finished runs among `runs`; with `curves`, each run's held-out accuracy is put there
    too ({cell: {seed: [(step, accuracy)]}}, for the figure); with `made`, the seeds each kind of CPU made ({cell:
    {cpu: [seeds]}}, from the records' headers)."""
    done = {}
    for c, s, out, flags, steps in runs:
        if (rec := finished(out, flags, steps, records)) is not None:
            done.setdefault(c, {})[s] = run_row(rec[0].get("commit"), rec[1])
            if made is not None:
                made.setdefault(c, {}).setdefault(rec[0].get("cpu") or "unknown", []).append(s)
            if curves is not None:
                curves.setdefault(c, {})[s] = [(r["step"], r["eval/accuracy"]) for r in rec[1]
                                               if r.get("eval/accuracy") is not None]
    return {c: cell_entry(runs) for c, runs in done.items()}


def write_grid(out: str, cells: dict, rows: dict, t0: float, curves: dict | None = None,
               made: dict | None = None) -> dict:
    """OUT/grid.{json,md}: per cell its collapse count (Wilson 95 %) and means, the tests, and each prediction's
    clauses with their verdicts (verdicts.levers_grid); marked partial until every planned run has finished (the
    first look's 8 seeds of every cell, and seeds 40-47 of the settings the extension rule picks from those). With
    `curves` (collect's), also OUT/grid.png (plots.levers_grid_figure), which grid.md shows; with `made`, the kinds
    of CPU that made each cell's seeds (description: a run's numbers depend on the kind, docs/reproduce.md)."""
    ts = grid_tests(cells)
    k_star, preset = rows["k_star"], rows["int4_preset"]
    planned_cells = levers.grid_cells(k_star, preset)
    first = {c: cell_entry({s: r for s, r in e["runs"].items() if s in levers.GRID_SEEDS}) for c, e in cells.items()}
    ext = extended(cells, planned_cells=planned_cells)
    planned = {(c, s) for c in planned_cells for s in levers.GRID_SEEDS} | \
        {(c, s) for c in planned_cells if c.split("/")[0] in ext for s in levers.EXTRA_SEEDS}
    missing = {(c, s) for c, s in planned if s not in cells.get(c, {"runs": {}})["runs"]}
    settings = {c.split("/")[0] for c in planned_cells}
    done8 = settings - {c.split("/")[0] for c, s in missing if s in levers.GRID_SEEDS}  # the first look is in
    done = settings - {c.split("/")[0] for c, _ in missing}  # every planned seed is in
    n_done = sum(e["n"] for e in cells.values())
    complete = done == settings
    counts = lambda cs: {c: (e["collapsed"], e["n"]) for c, e in cs.items()}  # noqa: E731
    verdict = verdicts.levers_grid(grid_tests(first), ts, counts(first), counts(cells), ext, k_star, preset, done8,
                                   done)
    lines = ["| cell | collapsed [Wilson 95 %] | best / final held-out (mean) | held-out area | max drawdown (mean) |",
             "|---" * 5 + "|"]
    for c, e in cells.items():
        rs = list(e["runs"].values())
        m = lambda k: fmt(sum(r[k] for r in rs if r[k] is not None) / max(1, len(rs)))  # noqa: E731
        lo, hi = wilson(e["collapsed"], e["n"])
        lines.append(f"| {c} | {e['collapsed']} of {e['n']} [{lo:.0%}, {hi:.0%}] | {m('best_heldout')} / "
                     f"{m('final_heldout')} | {m('heldout_area')} | {m('max_drawdown')} |")
    tl = ["| family | a | b | metric | a vs b | effect (a - b) | p | p (Holm) |", "|---" * 8 + "|"]
    tl += [f"| {t['family']} | {t['a']} | {t['b']} | {t['metric']} | {t['counts']} | {fmt(t['effect'])} | "
           f"{fmt(t['p'])} | {fmt(t['p_holm'])} |" for t in ts]
    pl = [f"- **{name}**: {levers.GRID_PREDICTIONS[name]}\n" + "\n".join(f"  - {clause}: **{v}**" for clause, v in cl)
          for name, cl in verdict.items()]
    status = "complete" if complete else f"**partial: {n_done} of {len(planned)} planned runs finished**"
    text = "\n\n".join([
        f"# The levers' grid (pre-registered in experiments/regime/levers.py; {status})",
        f"K* = {k_star}; int4 on {preset} ({rows['int4_why']}). Update: {levers.UPDATE_TEXT}.",
        f"Settings extended to seeds 40-47: {', '.join(ext) or 'none'} ({levers.EXTEND_TEXT}).",
        *(["![the levers' grid: collapse rates and held-out accuracy](grid.png)"] if curves is not None else []),
        "\n".join(lines), f"## Tests\n\n{levers.TESTS_TEXT}.", "\n".join(tl),
        f"## Predictions (written before the runs) and their verdicts\n\nRules (experiments/regime/verdicts.py, "
        f"fixed before the grid's first run): {verdicts.LEVERS_TEXT}.", "\n".join(pl),
        *([f"## The kinds of CPU that made the runs\n\n{HARDWARE_TEXT}.", kinds_lines(made)] if made else [])])
    data = dict(cells=cells, tests=ts, extended=ext, k_star=k_star, int4_preset=preset, complete=complete,
                runs=n_done, planned=len(planned), predictions=levers.GRID_PREDICTIONS, verdicts=verdict,
                verdict_rules=verdicts.LEVERS_TEXT,
                made_on={c: dict(sorted(v.items())) for c, v in (made or {}).items()})
    write_results(os.path.join(out, "grid.json"), data, md=text, t0=t0)
    if curves is not None:
        from experiments.regime import plots
        plots.levers_grid_figure(data, curves, os.path.join(out, "grid.png"))
    return data


def main(args, t0: float) -> dict:
    from experiments.regime import levers_measure, levers_report
    if not args.grid:
        if not args.report:
            levers_measure.make_rows(args.out, args.runs_dir, args.seeds, args.jobs)
        data = levers_report.rows_data(args.out, args.seeds, measured=args.measured)
        levers_report.write_rows(args.out, data, t0)
        return data
    rows = levers_report.rows_data(args.out, design.SEEDS, measured=args.measured)
    wanted = lambda runs: [r for r in runs if args.seeds is None or r[1] in args.seeds]  # noqa: E731
    full = plan(rows, args.runs_dir, levers.GRID_SEEDS)
    if not args.report:
        run_all([r[2:] for r in wanted(full)], jobs=args.jobs, log_dir=os.path.join(args.runs_dir, "logs"),
                records=args.records)
    ext = extended(collect(full, args.records), planned_cells=levers.grid_cells(*decided(rows)))
    extra = [r for r in plan(rows, args.runs_dir, levers.EXTRA_SEEDS) if r[0].split("/")[0] in ext]
    if wanted(extra) and not args.report:
        run_all([r[2:] for r in wanted(extra)], jobs=args.jobs, log_dir=os.path.join(args.runs_dir, "logs"),
                records=args.records)
    curves, made = {}, {}
    return write_grid(args.out, collect(full + extra, args.records, curves, made), rows, t0, curves, made)
