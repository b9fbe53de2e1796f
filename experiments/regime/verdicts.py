"""The predictions' verdicts, read off the tests by fixed rules: round 5's comparison (confirm.PREDICTIONS,
confirm.CONFIRM_PREDICTION) and the levers' grid (levers.GRID_PREDICTIONS).

Written 2026-12-07, before the first run of the comparison's seven other arms and of the levers' grid, and after 43 of
the confirmation's 96 runs had been reported (lv3-clip: no replay fell on 1 of 11 seeds, R3 on 0 of 11). It reads each
prediction as it was written at its design commit (4ea99c4, 0c588dd) and adds none; it only says, before the results,
which outcome of the pre-registered tests confirms or refutes each one, so that no verdict is a judgement made after
looking. A verdict is one of: confirmed, refuted, not decided (the tests cannot tell at this many seeds), or pending
(its runs are not all finished). Parts of a prediction that no pre-registered measure reads (GSPO "learns more slowly
early") are marked not tested, with the nearest number beside them as description.

  compare(cmp, confirmation)    {arm: verdict} for confirm.PREDICTIONS, and the confirmation's own prediction
  levers_grid(tests8, tests, counts8, counts, extended, k_star, complete8, complete)
                                the levers' grid predictions, clause by clause
"""
from experiments.common import fmt
from experiments.stats import newcombe

EQUIV_MARGIN = 0.25
KINDS_TEXT = (
    "a prediction's verdict, by its kind (arm - none is the arm's collapse rate minus no replay's at lv3-clip, seeds "
    "8-23; 'separates' is family A's Fisher test with Holm p < 0.05). 'About as no replay' (tis, mis): refuted when "
    "it separates, either way; confirmed when the Newcombe 95 % interval of arm - none lies within ±"
    f"{EQUIV_MARGIN:.2f} (at 16 seeds per arm the narrowest interval there is, 0 of 16 against 0 of 16, is ±0.19); "
    "otherwise not decided. 'No better than no replay' (r2): refuted when it separates with fewer falls; confirmed "
    f"when the interval's lower end is above -{EQUIV_MARGIN:.2f} (a cut of that size is ruled out); otherwise not "
    "decided. 'Fewer than no replay' (gspo): confirmed when it separates with fewer falls; refuted when "
    f"it separates with more, or when it falls at least once and the interval's lower end is above -{EQUIV_MARGIN:.2f} "
    "(a cut of that size is ruled out); otherwise not decided. 'Fewer, but not none' (icepop): as 'fewer', and also "
    "refuted when it separates with no fall at all. 'Holds' (r3, r3-tis, gspo-r3; 'no falls, or far fewer'): "
    "confirmed when the arm never falls, or separates with fewer falls; refuted as 'fewer' is; otherwise not decided")
KINDS = {"tis": "as-none", "icepop": "fewer-not-none", "mis": "as-none", "r2": "not-better", "r3": "holds",
         "r3-tis": "holds", "gspo": "fewer", "gspo-r3": "holds"}
NOT_TESTED = {"gspo": "'learns more slowly (smaller held-out area early)': no pre-registered measure reads the early "
                      "area; the whole-run held-out area against no replay is beside it, as description",
              "gspo-r3": "'learns at least as well as gspo alone': no pre-registered test compares the two; their "
                         "mean held-out areas are beside it, as description"}


def _verdict(kind: str, k: int, n: int, k0: int, n0: int, p_holm: float) -> tuple[str, str]:
    """(verdict, why) of one arm's collapse prediction of `kind`: k of n falls against no replay's k0 of n0."""
    sep = p_holm < 0.05
    fewer, rate, rate0 = k / n < k0 / n0, k / n, k0 / n0
    counts = f"{k}/{n} against no replay's {k0}/{n0}, Holm p {p_holm:.3g}"
    if kind == "as-none":
        lo, hi = newcombe(k, n, k0, n0)
        if sep:
            return "refuted", f"separates from no replay ({counts})"
        if -EQUIV_MARGIN <= lo and hi <= EQUIV_MARGIN:
            return "confirmed", f"arm - none {rate - rate0:+.2f} [{lo:+.2f}, {hi:+.2f}] within ±{EQUIV_MARGIN} ({counts})"
        return "not decided", f"arm - none [{lo:+.2f}, {hi:+.2f}] is wider than ±{EQUIV_MARGIN} ({counts})"
    if kind == "not-better":
        lo, hi = newcombe(k, n, k0, n0)
        if sep and fewer:
            return "refuted", f"separates from no replay with fewer falls ({counts})"
        if lo > -EQUIV_MARGIN:
            return "confirmed", f"arm - none {rate - rate0:+.2f} [{lo:+.2f}, {hi:+.2f}]: no cut of {EQUIV_MARGIN} " \
                                f"or more ({counts})"
        return "not decided", f"arm - none [{lo:+.2f}, {hi:+.2f}] leaves a cut of {EQUIV_MARGIN} open ({counts})"
    if kind == "holds" and k == 0:
        return "confirmed", f"never fell ({counts})"
    if kind == "fewer-not-none" and sep and fewer and k == 0:
        return "refuted", f"prevented every fall, which the prediction ruled out ({counts})"
    if sep and fewer:
        return "confirmed", f"fewer falls, separates ({counts})"
    lo, hi = newcombe(k, n, k0, n0)
    if sep or (k >= 1 and lo > -EQUIV_MARGIN):
        return "refuted", (f"separates with more falls ({counts})" if sep else
                           f"fell, and arm - none [{lo:+.2f}, {hi:+.2f}] rules out a cut of {EQUIV_MARGIN} ({counts})")
    return "not decided", f"does not separate; arm - none [{lo:+.2f}, {hi:+.2f}] ({counts})"


def compare(cmp: dict, confirmation: dict) -> dict:
    """{arm: dict(verdict, why[, not_tested])} for the comparison's predictions, and 'confirmation' for round 5's.
    `cmp` and `confirmation` are confirm_report.comparison's and .confirmation's output."""
    out = {}
    collapse_a = {t["arm"]: t for t in cmp["tests"] if t["family"] == "A" and t["metric"] == "collapsed"}
    area_a = {t["arm"]: t for t in cmp["tests"] if t["family"] == "A" and t["metric"] == "heldout_area"}
    base = cmp["arms"]["none"]
    for arm, kind in KINDS.items():
        x = cmp["arms"][arm]
        if not cmp["complete"]:
            v = dict(verdict="pending", why=f"partial: {cmp['runs']} of {cmp['total']} runs")
        else:
            verdict, why = _verdict(kind, x["collapsed"], x["n"], base["collapsed"], base["n"],
                                    collapse_a[arm]["p_holm"])
            v = dict(verdict=verdict, why=why)
        if arm in NOT_TESTED:
            t = area_a.get(arm)
            desc = (f"held-out area against no replay {t['effect']:+.3f}" if arm == "gspo" and t else
                    f"mean held-out area gspo-r3 {fmt(x['heldout_area'])}, gspo {fmt(cmp['arms']['gspo']['heldout_area'])}"
                    if arm == "gspo-r3" else "")
            v["not_tested"] = f"{NOT_TESTED[arm]} ({desc or 'no runs yet'})"
        out[arm] = v
    out["confirmation"] = _confirmation(confirmation)
    return out


CONFIRMATION_TEXT = (
    "clause by clause: 'the rule confirms at both settings' (the rule's verdict); 'R3 "
    "on none' (R3 falls on no fresh seed at either setting); 'no replay falls on about 40 % at lv3-clip and 35 % at "
    "lv3' (each inside the Wilson 95 % interval of no replay's rate there)")


def _confirmation(c: dict) -> dict:
    if not c["complete"]:
        return dict(verdict="pending", why=f"partial: {c['runs']} of {c['total']} runs")
    rows = {r["setting"]: r for r in c["rows"]}
    clauses = [("the rule confirms at both settings", all(r["confirmed"] for r in rows.values())),
               ("R3 falls on none", all(r["collapsed_r3"] == 0 for r in rows.values()))]
    for setting, rate in (("lv3-clip", 0.40), ("lv3", 0.35)):
        lo, hi = rows[setting]["rate_none_ci"]
        clauses.append((f"no replay about {rate:.0%} at {setting} (Wilson [{lo:.2f}, {hi:.2f}])", lo <= rate <= hi))
    why = "; ".join(f"{name}: {'yes' if ok else 'no'}" for name, ok in clauses)
    return dict(verdict="confirmed" if all(ok for _, ok in clauses) else "refuted", why=why)


# ------------------------------------------------------------------------------------------------ the levers' grid
LEVERS_TEXT = (
    "the levers' grid predictions, clause by clause. Counts 'of 8' read seeds 32-39 (the first look), whatever the "
    "extension does; a test reads the seeds the setting ran (8, or 16 when extended). lag1: 'each arm 0-1 falls of 8' "
    "and 'nothing separates' (the setting is not extended and no Holm p < 0.05). lagK: 'no replay falls on 1-3 of 8'; "
    "'R3 does not separate from no replay' (family A's Holm p >= 0.05); 'TIS falls least' (fewer falls than none and "
    "than r3). int4: 'no replay on 2-4 of 8'; 'R3 on fewer (0-2)' (r3's count at most 2 and below none's); 'TIS about "
    "as no replay' (counts within one of each other, of 8); 'r3-tis fewest' (no arm falls less); 'at 8 seeds no Holm "
    "p below 0.05' (every test of the first look); 'the extension rule runs seeds 40-47'. A clause is pending until its "
    "seeds are finished")


def levers_grid(tests8: list[dict], tests: list[dict], counts8: dict, counts: dict, extended: list[str],
                k_star: int, preset: str, complete8: bool, complete: bool) -> dict:
    """{setting name: [(clause, verdict)]}. counts / counts8: {cell: (collapsed, n)} over all seeds / seeds 32-39;
    tests / tests8: levers_run.grid_tests over all seeds / seeds 32-39."""
    def c(cell, first=True):
        return (counts8 if first else counts).get(cell, (0, 0))[0]

    def yes(ok, done):
        return "pending" if not done else ("confirmed" if ok else "refuted")

    def sep(setting, tl):
        return any(t["p_holm"] < 0.05 for t in tl if t["a"].startswith(setting + "/"))

    def test(setting, a, b, tl):
        return next((t for t in tl if t["a"] == f"{setting}/{a}/n4" and t["b"] == f"{setting}/{b}/n4"
                     and t["metric"] == "collapsed"), None)

    out = {}
    s1 = "lag1-clip"
    out["lag1"] = [("each arm 0-1 falls of 8", yes(all(c(f"{s1}/{a}/n4") <= 1 for a in ("none", "r3", "tis")),
                                                   complete8)),
                   ("nothing separates", yes(s1 not in extended and not sep(s1, tests), complete))]
    if k_star != 1:
        sk = f"lag{k_star}-clip"
        t = test(sk, "none", "r3", tests)
        tis, none, r3 = (c(f"{sk}/{a}/n4", False) for a in ("tis", "none", "r3"))
        out["lagK"] = [("no replay falls on 1-3 of 8", yes(1 <= c(f"{sk}/none/n4") <= 3, complete8)),
                       ("R3 does not separate from no replay", yes(t is not None and t["p_holm"] >= 0.05, complete)),
                       ("TIS falls least", yes(tis < none and tis < r3, complete))]
    si = f"{preset}-int4-clip"
    n8, r8, t8 = (c(f"{si}/{a}/n4") for a in ("none", "r3", "tis"))
    allc = {a: c(f"{si}/{a}/n4", False) for a in ("none", "r3", "tis", "r3-tis")}
    out["int4"] = [("no replay falls on 2-4 of 8", yes(2 <= n8 <= 4, complete8)),
                   ("R3 on fewer (0-2 of 8)", yes(r8 <= 2 and r8 < n8, complete8)),
                   ("TIS about as no replay (within one fall of 8)", yes(abs(t8 - n8) <= 1, complete8)),
                   ("r3-tis fewest", yes(allc["r3-tis"] <= min(allc.values()), complete)),
                   ("at 8 seeds no Holm-adjusted p below 0.05", yes(not sep(si, tests8), complete8)),
                   ("the extension rule runs seeds 40-47", yes(si in extended, complete8))]
    return out
