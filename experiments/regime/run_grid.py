"""Run the regime grid and write its tables: `python -m experiments.regime --grid` / `--report`.

Reads OUT/regime.json (the committed calibration: the paper-matched position, the deep preset's depth and step time,
the walk length, the steps per run); refuses to start without it. Runs tier by tier, seed-major within a tier, so a
partial grid is balanced; finished runs leave records in OUT/records (committed), from which every table is made.
Writes OUT/grid.{json,md,png}, OUT/kl.png (every run's kl over training) and OUT/dose.png (collapse and held-out
area against the measured flip rates, the logistic fits, survival curves).
"""
import json
import os
import statistics

from experiments.common import fmt, write_results
from experiments.regime import design
from experiments.regime.grid import _mean, answer, cell_entry, cell_run, compare, run_row
from experiments.stats import bootstrap_crossing, crossing, logistic_fit
from experiments.sweep import finished, run_all
from r3.errors import InputError


def calibration(path: str) -> dict:
    if not os.path.exists(path):
        raise InputError(f"{path} is missing: run `python -m experiments.regime` (the calibration) and commit it "
                         f"before the grid")
    with open(path) as f:
        cal = json.load(f)
    if not cal.get("pilot"):
        raise InputError(f"{path} has no steps pilot yet: finish the calibration first")
    return cal


def deep_steps(cal: dict, steps: int) -> int:
    """DEEP_STEPS_TEXT."""
    t = (cal.get("timing") or {}).get("step_time_s", {}).get("deep")
    if t is None:
        return steps
    fit = int(design.DEEP_BUDGET_CORE_H * 3600 / (16 * t * 1.1)) // 50 * 50
    return min(steps, fit)


def deep_state(cal: dict) -> tuple[bool, str, bool]:
    """DEEP_RUN_TEXT: (run the deep cell?, why, still pending?). The budget is checked first: when too few steps fit,
    the cell is out whatever its warm-ups do, so it is not pending on them."""
    d = cal["depth"]
    if not d.get("decided"):
        return False, "the depth rule is undecided", True
    steps = deep_steps(cal, cal["pilot"]["steps"])
    if steps < design.DEEP_MIN_STEPS:
        return False, f"only {steps} steps fit the {design.DEEP_BUDGET_CORE_H:g} core-hour budget", False
    warm = [cal.get("deep_warmup", {}).get(str(s)) for s in design.DEPTH_SEEDS]
    if not all(w and w.get("reached") for w in warm) and any(w and not w.get("reached") for w in warm):
        why = (f"its start-matched warm-up did not reach {design.WARMUP_UNTIL} within {design.WARMUP_CAP} steps on "
               f"seeds {list(design.DEPTH_SEEDS)} (probe rewards "
               f"{[None if not w else round(w['probe_reward'], 3) for w in warm]})")
        return False, why, False
    if not all(warm):
        return False, f"its start-matched warm-ups at {d['depth']} layers are not measured yet", True
    return True, f"{steps} steps", False


def deep_runs(cal: dict) -> tuple[bool, str]:
    """DEEP_RUN_TEXT: (run the deep cell?, why)."""
    return deep_state(cal)[:2]


def walk_length(cal: dict) -> int | None:
    """The walk length rule (design.WALK_LENGTHS): the shortest T whose S reaches 3, else None (tier 3 not run)."""
    for T, w in sorted((int(k), v) for k, v in (cal.get("walk") or {}).items()):
        if w["exposure"]["mean"] is not None and w["exposure"]["mean"] >= design.PAPER["exposure"][0]:
            return T
    return None


def plan(args, cal: dict) -> list[tuple]:
    steps, paper, walk_T = cal["pilot"]["steps"], cal["paper_matched"], walk_length(cal)
    tiers = design.tier_cells(paper, deep=deep_runs(cal)[0], walk=walk_T is not None)
    out = []
    for tier in sorted(args.tiers):
        for s in args.seeds:
            for c in tiers[tier]:
                n = deep_steps(cal, steps) if c.startswith("deep/") else steps
                out.append((tier, c, s, *cell_run(c, s, args.runs_dir, n, paper=paper, walk_T=walk_T)))
    return out


def dose(cells: dict, cal: dict) -> dict:
    """Collapse against each position's measured flip rates (start of RL), per arm at 4 mini-steps: the logistic fit
    and where no replay's fitted collapse rate passes 0.5, with its bootstrap interval."""
    res = {}
    for quantity in ("router_flip_rate", "token_flip_rate"):
        for arm in ("none", "r3"):
            xs, ys, area = [], [], []
            for p in design.POSITIONS:
                x = cal["table"][p]["start"][quantity]["mean"]
                for r in cells.get(f"{p}/{arm}/n4", {}).get("runs", {}).values():
                    xs.append(x)
                    ys.append(int(r["collapse_step"] is not None))
                    area.append((x, r["heldout_area"]))
            if not xs:
                continue
            entry = dict(a=None, b=None, x50=None, runs=len(xs), collapsed=sum(ys), area=area, range=[min(xs), max(xs)])
            if 0 < sum(ys) < len(ys):  # all runs alike: the fit's slope is rounding noise of either sign, no fit
                a, b = logistic_fit(xs, ys)
                x50 = crossing(a, b)
                entry.update(a=a, b=b, x50=x50, x50_beyond=x50 is not None and not min(xs) <= x50 <= max(xs))
            if arm == "none" and any(ys):
                entry["x50_interval"] = bootstrap_crossing(xs, ys)
            res[f"{quantity}/{arm}"] = entry
    return res


def survival(cells: dict, steps: int, deep_steps: int | None = None) -> dict:
    """Per cell, the fraction of runs not yet collapsed at each collapse step (1 at 0; the last value at the end, the
    cell's own steps: the deep cell may run fewer)."""
    out = {}
    for c, d in cells.items():
        end = deep_steps if deep_steps is not None and c.startswith("deep/") else steps
        n, falls = d["n"], sorted(r["collapse_step"] for r in d["runs"].values() if r["collapse_step"] is not None)
        if n:
            out[c] = [[0, 1.0]] + [[s, 1 - (i + 1) / n] for i, s in enumerate(falls)] + [[end, 1 - len(falls) / n]]
    return out


def completeness(cells: dict, cal: dict, args) -> dict:
    """{tier: complete?} for every tier the design runs: complete when every seed of design.SEEDS finished every cell
    of the tier (a report over fewer tiers or seeds is partial, whatever it holds), and for tier 2 the deep cell is
    decided (a pending deep cell keeps it open)."""
    run, _, pending = deep_state(cal)
    tiers = design.tier_cells(cal["paper_matched"], deep=run, walk=walk_length(cal) is not None)
    out = {}
    for t, cs in tiers.items():
        if cs:
            out[t] = (t in args.tiers and set(design.SEEDS) <= set(args.seeds)
                      and all(c in cells and cells[c]["n"] >= len(design.SEEDS) for c in cs)
                      and not (t == 2 and pending))
    return out


def main(args, t0: float) -> dict:
    from experiments.regime import plots
    cal = calibration(args.calibration)
    runs = plan(args, cal)
    records = args.records
    if not args.report:
        run_all([(o, f, n) for _, _, _, o, f, n in runs], jobs=args.jobs, log_dir=os.path.join(args.runs_dir, "logs"),
                records=records)
    done, rows_by = {}, {}
    for tier, c, s, o, f, n in runs:
        if (rec := finished(o, f, n, records)) is not None:
            done.setdefault(c, {})[s] = run_row(rec[0]["commit"], rec[1])
            rows_by[c, s] = rec[1]
    names = list(dict.fromkeys(c for _, c, *_ in runs))
    progress = {}
    for tier, c, s, *_ in runs:
        progress.setdefault(str(tier), [0, 0])[1] += 1
        progress[str(tier)][0] += s in done.get(c, {})
    cells = {c: cell_entry(done.get(c, {})) for c in names}
    complete = completeness(cells, cal, args)
    ts = compare(cells, cal["paper_matched"])
    ans = answer(ts, complete.get(1, False))
    dr = dose(cells, cal)
    surv = survival(cells, cal["pilot"]["steps"], deep_steps(cal, cal["pilot"]["steps"]))
    data = dict(rule=design.RULE_TEXT, tests_text=design.TESTS_TEXT, selection_text=design.SELECTION_TEXT,
                predictions=design.PREDICTIONS, common=design.COMMON, steps=cal["pilot"]["steps"],
                deep_steps=deep_steps(cal, cal["pilot"]["steps"]), deep=dict(zip(("run", "why"), deep_runs(cal))),
                seeds=list(args.seeds), tiers=args.tiers, progress=progress,
                complete=complete, paper_matched=cal["paper_matched"],
                settings={p: dict(points=design.POSITIONS.get(p), **{k: cal["table"][p]["start"][k]["mean"] for k in
                                                                  ("router_flip_rate", "token_flip_rate", "exposure")})
                          for p in cal["table"]},
                cells=cells, tests=ts, answer=ans, dose=dr, survival=surv)
    md = report_md(data)
    write_results(os.path.join(args.out, "grid.json"), data, md=md, t0=t0)
    for name in plots.FIGURES:
        plots.grid_figure(cells, rows_by, cal, os.path.join(args.out, name), name)
    plots.dose_figure(data, cal, os.path.join(args.out, "dose.png"))
    print(md)
    return data


def with_interval(x, lo, hi) -> str:
    return fmt(x) if lo is None else f"{fmt(x)} [{fmt(lo)}, {fmt(hi)}]"


def pair_line(d: dict, a: str, b: str, head: str) -> str | None:
    """One sentence of numbers for none (`a`) against R3 (`b`), or None until both have a finished seed and a test."""
    tests = {(t["a"], t["b"], t["metric"]): t for t in d["tests"]}
    none, r3 = d["cells"].get(a), d["cells"].get(b)
    if not none or not r3 or not none["n"] or not r3["n"]:
        return None
    t = {m: tests.get((a, b, m)) for m in ("collapsed", "heldout_area", "max_drawdown")}
    if None in t.values():
        return None
    s = d["settings"].get(design.base_setting(a), {})
    mean = lambda c, k: fmt(_mean([r[k] for r in c["runs"].values()]))  # noqa: E731
    return (f"**{head}** ({fmt(s.get('router_flip_rate'), 100, spec='.1f')} % of routers, "
            f"{fmt(s.get('token_flip_rate'), 100, spec='.1f')} % of tokens flipped at the start): no replay collapsed "
            f"{none['collapsed']} of {none['n']}, R3 {r3['collapsed']} of {r3['n']} "
            f"(Fisher p {t['collapsed']['p']:.3g}); "
            f"held-out area {mean(none, 'heldout_area')} against {mean(r3, 'heldout_area')} (none - r3 "
            f"{with_interval(t['heldout_area']['effect'], t['heldout_area']['lo'], t['heldout_area']['hi'])}, "
            f"p {t['heldout_area']['p']:.3g}); largest drawdown {mean(none, 'max_drawdown')} against "
            f"{mean(r3, 'max_drawdown')} (p {t['max_drawdown']['p']:.3g}); kl {mean(none, 'mean_kl')} against "
            f"{mean(r3, 'mean_kl')}, its trend {mean(none, 'kl_trend')} against {mean(r3, 'kl_trend')} (log10, last "
            f"100 steps over the first 100: above 0 rises).")


def position_lines(d: dict) -> list[str]:
    """One sentence of numbers per dial position (4 mini-steps) with both arms finished on some seed."""
    lines = (pair_line(d, f"{p}/none/n4", f"{p}/r3/n4", p) for p in design.POSITIONS)
    return [x for x in lines if x]


def tier2_lines(d: dict) -> list[str]:
    """The same sentence for tier 2's none/r3 pairs: 1 mini-step at the strongest and paper-matched positions, and
    the strongest under the clipped update real stacks use."""
    st, pm = design.STRONGEST, d["paper_matched"]
    pairs = [(f"{p}/none/n1", f"{p}/r3/n1", f"{p}, 1 mini-step") for p in dict.fromkeys((st, pm))]
    pairs.append((f"{st}-clip/none/n4", f"{st}-clip/r3/n4", f"{st}-clip, 4 mini-steps, clipped update"))
    lines = (pair_line(d, a, b, h) for a, b, h in pairs)
    return [x for x in lines if x]


def report_md(d: dict) -> str:
    done = sum(c["n"] for c in d["cells"].values())
    total = len(d["cells"]) * len(d["seeds"])
    status = ("complete" if d["complete"] and all(d["complete"].values()) else
              f"**partial: {done} of {total} runs finished**" + ("" if done < total else
                                                                 ", and the design's other tiers, seeds or deep cell "
                                                                 "are not in"))
    if d.get("progress") and status != "complete":
        status += "; " + ", ".join(
            f"tier {t}: {n} of {m}" + (", complete" if d["complete"].get(int(t)) else "")
            for t, (n, m) in d["progress"].items())
    parts = [f"# The regime grid ({status})", f"Rule (fixed before any run): {d['rule']}.",
             f"Every run: `{d['common']}` with its cell's flags; {d['steps']} steps (the deep cell: "
             f"{d['deep']['why'] if d['deep']['run'] else 'not run, ' + d['deep']['why']}); seeds "
             f"{d['seeds']}; tiers {d['tiers']}; paper-matched position {d['paper_matched']}.",
             "| cell | routers / tokens flipped (start) | collapsed | best / final held-out (mean) | held-out area | "
             "max drawdown (mean) | median max grad norm | mean kl | kl trend (mean) | step max \\|log r\\|: median, "
             "steps > 10 (mean; descriptive) | greedy accuracy, trainer - engine (mean; descriptive) |\n" +
             "|---" * 11 + "|"]
    for c, e in d["cells"].items():
        rs = list(e["runs"].values())
        s = d["settings"].get(design.base_setting(c), {})
        mean = lambda k: fmt(_mean([r[k] for r in rs]))  # noqa: E731
        gn = [r["max_grad_norm"] for r in rs if r["max_grad_norm"] is not None]
        falls = sorted(r["collapse_step"] for r in rs if r["collapse_step"] is not None)
        parts[-1] += (f"\n| {c} | {fmt(s.get('router_flip_rate'))} / {fmt(s.get('token_flip_rate'))} | "
                      f"{e['collapsed']} of {e['n']}{' @ ' + str(falls) if falls else ''} | {mean('best_heldout')} / "
                      f"{mean('final_heldout')} | {mean('heldout_area')} | {mean('max_drawdown')} | "
                      f"{fmt(statistics.median(gn) if gn else None)} | {mean('mean_kl')} | {mean('kl_trend')} | "
                      f"{mean('median_max_log_ratio')}, {mean('steps_log_ratio_over_10')} | "
                      f"{mean('served_gap')} |")
    parts += ["## Tests", f"Pre-registered: {d['tests_text']}.",
              "\n".join(["| a | b | metric | a vs b | effect (a - b) [95 % t interval over seeds] | p |",
                         "|---|---|---|---|---|---|"] +
                        [f"| {t['a']} | {t['b']} | {t['metric']} | {t['counts']} | "
                         f"{with_interval(t['effect'], t.get('lo'), t.get('hi'))} | {t['p']:.3g} |"
                         for t in d["tests"]])]
    a = d["answer"]
    parts += ["## The answer at 4 mini-steps (Holm over the five positions)",
              "\n".join(["| position | none vs r3 collapsed | Fisher p | Holm p | held-out area (none - r3) [95 % t] | "
                         "paired p | Holm p | R3 holds where no replay collapses |", "|---" * 8 + "|"] +
                        [f"| {r['position']} | {r['counts']} | {r['p']:.3g} | {r['p_holm']:.3g} | "
                         f"{with_interval(r['area_effect'], r.get('area_lo'), r.get('area_hi'))} | {r['p_area']:.3g} | "
                         f"{r['p_area_holm']:.3g} | "
                         f"{'yes' if r['r3_holds'] else 'no'} |" for r in a["positions"]])]
    parts += ["## At each position, in numbers (4 mini-steps, none against r3; the page's words are written from "
              "these)",
              "\n".join(f"- {line}" for line in position_lines(d)) or "no finished pair yet"]
    if 2 in d["tiers"]:
        parts += ["## Tier 2, in numbers (none against r3; the clipped update: `" +
                  " ".join(f"{k} {v}" for k, v in design.CLIP_FLAGS) + "`)",
                  "\n".join(f"- {line}" for line in tier2_lines(d)) or "no finished pair yet"]
    pick = a["pick"]
    parts.append(f"Most separating setting ({d['selection_text']}): " + (
        "no tests yet" if pick is None else f"{pick['position']} (p = {pick['p']:.3g}, Holm {pick['p_holm']:.3g}); "
        + ("it becomes experiments.collapse's default" if a["separates"] else
           "provisional: tier 1 is partial" if not a["complete"] else "it does not separate: the default stays")))
    lines = []
    for k, e in d["dose"].items():
        iv = e.get("x50_interval")
        if e["a"] is None:
            fit = f"no fit: {'every' if e['collapsed'] else 'no'} run collapsed | — | —"
        else:
            fit = (f"{e['a']:.3g} | {e['b']:.3g} | {fmt(e['x50'])}" +
                   (f" (beyond the measured {fmt(e['range'][0])}-{fmt(e['range'][1])})" if e.get("x50_beyond") else ""))
        lines.append(f"| {k} | {e['collapsed']} of {e['runs']} | {fit} | "
                     + (f"[{fmt(iv['lo'])}, {fmt(iv['hi'])}]; of the draws, {iv['passed']:.0%} above 50 % already "
                        f"at {fmt(iv['range'][0])}, {iv['not_reached']:.0%} not reaching it by {fmt(iv['range'][1])}"
                        if iv else "—") + " |")
    parts += ["## Dose-response (logistic fit of collapse on the position's flip rate at the start of RL)",
              "\n".join(["| flip rate / arm | collapsed | a | b | 50 % at | 95 % interval (bootstrap) |",
                         "|---|---|---|---|---|---|"] + lines)]
    parts += ["## Predictions (pre-registered)", "\n".join(f"- {p}" for p in d["predictions"])]
    return "\n\n".join(parts)

