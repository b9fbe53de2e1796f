"""Reading the staleness grid: each cell's summary and the tests between cells, then each reading design.py fixed
before the runs: the most separating setting, which mechanism, whether R3 climbs less, whether a seed's start says
whether it climbs, and what the follow-up controls say. Pure functions of the runs' metrics rows (or grid.json).
"""
import statistics

from experiments.common import fmt
from experiments.rules import _mean, cell_summary, run_summary
from experiments.staleness.design import (CONTROL_ARMS, CONTROL_ENGINE, LEARN_FLOOR, LEARN_SEEDS, LEARN_TEST,
                                          MATCHED, MINI_STEPS, PRECISION_TESTS, SEEDS, STALENESS_TESTS,
                                          START_CLIMB, START_FLOOR, START_SEEDS, TESTS, alias, control_cells)
from experiments.stats import fisher_exact, holm, permutation_test

def summarize(done: dict, cells: list[str]) -> dict:
    return {c: cell_summary({s: run_summary(o, rows, k) for s, (o, rows, k, _) in sorted(done.get(c, {}).items())},
                            None if alias(c) == c else alias(c)) for c in cells}


def tests(cells: dict) -> list[dict]:
    return pair_tests(cells, [(a.format(N=n), b.format(N=n)) for n in MINI_STEPS for a, b in TESTS] + MATCHED)


def pair_tests(cells: dict, pairs: list[tuple[str, str]]) -> list[dict]:
    """Fisher's exact test on sustained collapse counts and the permutation test on max drawdown, a vs b, for each
    pair whose cells both have runs (an aliased pair, or a pair seen already, is skipped)."""
    res, seen = [], set()
    for a, b in pairs:
        if a not in cells or b not in cells or alias(a) == alias(b) or (alias(a), alias(b)) in seen:
            continue
        if not cells[a]["n"] or not cells[b]["n"]:  # a partial grid: no test on a cell without runs yet
            continue
        seen.add((alias(a), alias(b)))
        ca, cb = cells[a], cells[b]
        res.append(dict(a=a, b=b, metric="collapsed", p=fisher_exact(ca["collapsed"], ca["n"], cb["collapsed"],
                                                                       cb["n"]),
                        effect=(ca["collapsed"] / ca["n"] - cb["collapsed"] / cb["n"]) if ca["n"] and cb["n"]
                        else None, counts=f"{ca['collapsed']}/{ca['n']} vs {cb['collapsed']}/{cb['n']}"))
        da, db = ([r["max_drawdown"] for r in c["runs"].values() if r["max_drawdown"] is not None] for c in (ca, cb))
        res.append(dict(a=a, b=b, metric="max_drawdown", p=permutation_test(da, db),
                        effect=_mean(da) - _mean(db) if da and db else None,
                        counts=f"mean {fmt(_mean(da))} vs {fmt(_mean(db))}"))
    return res


def most_separating(ts: list[dict]) -> dict | None:
    """SELECTION_TEXT on the grid's tests: {N, p, p_drawdown, counts, direction, separates} or None (no tests)."""
    by_n = {}
    for t in ts:
        a, b = t["a"].split("/"), t["b"].split("/")
        if a[:2] == ["fp8-router", "none"] and b[:2] == ["fp8-router", "r3"] and a[2] == b[2] and \
                a[2][1:].isdigit():
            by_n.setdefault(int(a[2][1:]), {})[t["metric"]] = t
    if not by_n:
        return None
    n = min(by_n, key=lambda k: (by_n[k]["collapsed"]["p"], by_n[k]["max_drawdown"]["p"], k))
    c, d = by_n[n]["collapsed"], by_n[n]["max_drawdown"]
    direction = ("no replay collapsed more" if c["effect"] > 0 else "R3 collapsed more" if c["effect"] < 0
                 else "equal collapse counts")
    return dict(N=n, p=c["p"], p_drawdown=d["p"], counts=c["counts"], direction=direction, separates=c["p"] < 0.05)


def mechanism(ts: list[dict], complete: bool) -> dict:
    """MECHANISM_TEXT on the grid's tests: per mechanism its tests with Holm-adjusted p, supported / against; and the
    verdict, (a), (b), (a) and (b), or (c) (None while the grid is partial or a test is missing)."""
    fisher = {(t["a"], t["b"]): t for t in ts if t["metric"] == "collapsed"}
    out, missing = {}, False
    for key, pairs in (("a", PRECISION_TESTS), ("b", STALENESS_TESTS)):
        found = [(a, b, fisher.get((a, b))) for a, b in pairs]
        missing |= any(t is None for _, _, t in found)
        have = [(a, b, t) for a, b, t in found if t is not None]
        adj = holm([t["p"] for _, _, t in have])
        rows = [dict(a=a, b=b, counts=t["counts"], p=t["p"], p_holm=q, effect=t["effect"])
                for (a, b, t), q in zip(have, adj)]
        out[key] = dict(tests=rows, supported=any(r["p_holm"] < 0.05 and r["effect"] > 0 for r in rows),
                        against=any(r["p_holm"] < 0.05 and r["effect"] < 0 for r in rows))
    # (b) from a replay test (none vs r2) says routing; from the fresh-minibatch tests alone, staleness in general
    out["b"]["by_replay"] = any(r["p_holm"] < 0.05 and r["effect"] > 0 and r["b"].split("/")[1] == "r2"
                                for r in out["b"]["tests"])
    sa, sb = out["a"]["supported"], out["b"]["supported"]
    verdict = "(a) and (b)" if sa and sb else "(a)" if sa else "(b)" if sb else "(c)"
    return dict(precision=out["a"], staleness=out["b"], verdict=verdict if complete and not missing else None,
                provisional=verdict)


def learning(cells: dict) -> dict:
    """LEARN_TEXT on the grid's cells: the test on LEARN_SEEDS, and the descriptive comparisons beside it."""
    def runs(c: str) -> dict:
        return {int(s): r for s, r in cells.get(c, {}).get("runs", {}).items()}  # grid.json's seed keys are str

    def best(c: str, seeds=None) -> list[float]:
        return [r["best_heldout"] for s, r in sorted(runs(c).items())
                if r["best_heldout"] is not None and (seeds is None or s in seeds)]

    def compare(a: str, b: str, seeds=None) -> dict:
        xa, xb = best(a, seeds), best(b, seeds)
        return dict(a=a, b=b, a_best=xa, b_best=xb, effect=_mean(xa) - _mean(xb) if xa and xb else None,
                    p=permutation_test(xa, xb))
    a, b = (runs(c) for c in LEARN_TEST)
    finished = [s for s in LEARN_SEEDS if s in a and s in b]
    kept = [s for s in finished if max(a[s]["best_heldout"] or 0, b[s]["best_heldout"] or 0) > LEARN_FLOOR]
    test = dict(compare(*LEARN_TEST, kept), seeds=kept, left_out=[s for s in finished if s not in kept])
    decided = len(finished) == len(LEARN_SEEDS)
    test["confirmed"] = (test["p"] < 0.05 and test["effect"] < 0) if decided else None
    shown = [compare(*LEARN_TEST), compare("fp8-router/r3/n4", "fp8-router/none/n4"),
             compare("fp8-router/r3/n8", "fp8-router/r2/n8"), compare("fp8-router/r3/n8", "fp8-router/none/n8")]
    return dict(test=test, shown=shown)


def start(cells: dict, seeds=SEEDS) -> dict:
    """START_TEXT on the grid's cells: per seed its start, its best held-out at N >= 4, and whether it fits."""
    rows = []
    for seed in seeds:
        runs = {c: d["runs"][str(seed)] if str(seed) in d["runs"] else d["runs"].get(seed)
                for c, d in cells.items() if not d.get("alias_of")}
        runs = {c: r for c, r in runs.items() if r is not None}
        firsts = [r["first_reward"] for r in runs.values() if r.get("first_reward") is not None]
        if not firsts:
            continue
        high = [c for c in runs if c.split("/")[2] in ("n4", "n8")]
        best = max((runs[c]["best_heldout"] or 0 for c in high), default=None)
        first = statistics.median(firsts)
        complete = len(high) == sum(c.split("/")[2] in ("n4", "n8") for c, d in cells.items()
                                    if not d.get("alias_of"))
        fits = None if best is None or not complete else (first < START_FLOOR) == (best <= START_CLIMB)
        rows.append(dict(seed=seed, start=first, runs=len(firsts), best_n4_n8=best, n4_n8_runs=len(high),
                         complete=complete, fits=fits, tested=seed in START_SEEDS))
    tested = [r for r in rows if r["tested"]]
    decided = len(tested) == len(START_SEEDS) and all(r["complete"] for r in tested)
    return dict(seeds=rows, holds=all(r["fits"] for r in tested) if decided else None)


def control_n(grid_json: dict) -> int:
    """CONTROL_N_TEXT on a complete grid.json."""
    falls = {n: grid_json["cells"][f"{CONTROL_ENGINE}/none/n{n}"]["collapsed"] for n in (4, 8)}
    return max(falls, key=lambda n: (falls[n], -n))


def control_verdict(cells: dict, n: int, seeds, probe: bool = False) -> dict:
    """CONTROL_TEXT on the cells at N: both tests, each with its Holm p (over the 2 always: a test whose cells have no
    runs yet reads p = 1) and reading; `decided` once every cell has `seeds`, never for a probe (other seeds, lr,
    steps, flags or an N not the rule's)."""
    base = f"{CONTROL_ENGINE}/none/n{n}"
    rows = []
    none = dict(collapsed=0, n=0)
    for arm in CONTROL_ARMS:
        a, b = cells.get(base, none), cells.get(f"{CONTROL_ENGINE}/{arm}/n{n}", none)
        have = a["n"] and b["n"]
        rows.append(dict(arm=arm, a=base, b=f"{CONTROL_ENGINE}/{arm}/n{n}",
                         counts=f"{a['collapsed']}/{a['n']} vs {b['collapsed']}/{b['n']}",
                         p=fisher_exact(a["collapsed"], a["n"], b["collapsed"], b["n"]) if have else 1.0,
                         effect=a["collapsed"] / a["n"] - b["collapsed"] / b["n"] if have else None))
    out = {}
    for r, q in zip(rows, holm([r["p"] for r in rows])):
        arm = r.pop("arm")
        reading = ("no runs yet" if r["effect"] is None else
                   "supported: no replay collapsed more" if q < 0.05 and r["effect"] > 0 else
                   f"the {arm} control collapsed more" if q < 0.05 and r["effect"] < 0 else "not shown")
        out[{"dense": "routing", "clip": "trust region"}[arm]] = dict(r, p_holm=q, reading=reading)
    finished = all(cells.get(c, {}).get("n") == len(seeds) for c in (base, *control_cells(n)[2:]))
    return dict(tests=out, decided=finished and not probe, probe=probe)
