"""The predictions' verdicts, read off the tests by fixed rules: round 5's comparison (confirm.PREDICTIONS,
confirm.CONFIRM_PREDICTION) and the levers' grid (levers.GRID_PREDICTIONS).

Written 2026-12-07, before the first run of the comparison's seven other arms and of the levers' grid, and after 43 of
the confirmation's 96 runs had been reported (lv3-clip: no replay fell on 1 of 11 seeds, R3 on 0 of 11). It reads each
prediction as it was written at its design commit (4ea99c4, 0c588dd) and adds none; it only says, before the results,
which outcome of the pre-registered tests confirms or refutes each one, so that no verdict is a judgement made after
looking. A verdict is one of: confirmed, refuted, not decided (the tests cannot tell at this many seeds), pending (its
runs are not all finished), or not tested. Parts of a prediction that no pre-registered measure reads (GSPO "learns
more slowly early") are marked not tested, with the nearest number beside them as description.

  compare(cmp, confirmation)    {arm: verdict} for confirm.PREDICTIONS, and the confirmation's own prediction
  levers_grid(tests8, tests, counts8, counts, extended, k_star, preset, done8, done)
                                the levers' grid predictions, clause by clause
"""
from experiments.common import fmt
from experiments.regime import levers
from experiments.stats import newcombe

KINDS_TEXT = (
    "a prediction's verdict, by its kind ('separates' is family A's Fisher test of the arm against no replay at "
    "lv3-clip, seeds 8-23, with Holm p < 0.05; arm - none is the difference of collapse rates, printed with its "
    "Newcombe 95 % interval). 'About as no replay' (tis, mis): refuted when it separates, either way; otherwise not "
    "decided (at 16 seeds per arm no equivalence can be shown, so this prediction can only fail). 'No better than no "
    "replay' (r2): refuted when it separates with fewer falls; otherwise not decided. 'Fewer than no replay' (gspo): "
    "confirmed when it separates with fewer falls, refuted when it separates with more; otherwise not decided. 'Fewer, "
    "but not none' (icepop): as 'fewer', and also refuted when it separates with no fall at all. 'Holds' (r3, r3-tis, "
    "gspo-r3: 'no falls, or far fewer'): confirmed when the arm never falls or separates with fewer falls; refuted "
    "when it separates with more, or falls at least once and at least as often as no replay (then neither half of the "
    "prediction is true of the runs); otherwise not decided. Every verdict is pending until all 144 runs are in")
KINDS = {"tis": "as-none", "icepop": "fewer-not-none", "mis": "as-none", "r2": "not-better", "r3": "holds",
         "r3-tis": "holds", "gspo": "fewer", "gspo-r3": "holds"}
NOT_TESTED = {"gspo": "'learns more slowly (smaller held-out area early)': no pre-registered measure reads the early "
                      "area; the whole-run held-out area against no replay is beside it, as description",
              "gspo-r3": "'learns at least as well as gspo alone': no pre-registered test compares the two; their "
                         "mean held-out areas are beside it, as description"}


def _verdict(kind: str, k: int, n: int, k0: int, n0: int, p_holm: float) -> tuple[str, str]:
    """(verdict, why) of one arm's collapse prediction of `kind`: k of n falls against no replay's k0 of n0."""
    sep, fewer, more = p_holm < 0.05, k / n < k0 / n0, k / n > k0 / n0
    lo, hi = newcombe(k, n, k0, n0)
    counts = f"{k}/{n} against no replay's {k0}/{n0}, arm - none {k / n - k0 / n0:+.2f} [{lo:+.2f}, {hi:+.2f}], " \
             f"Holm p {p_holm:.3g}"
    if kind == "as-none":
        return ("refuted", f"separates ({counts})") if sep else ("not decided", f"does not separate ({counts})")
    if kind == "not-better":
        return ("refuted", f"separates with fewer falls ({counts})") if sep and fewer else \
            ("not decided", f"no cut shown ({counts})")
    if kind == "holds" and k == 0:
        return "confirmed", f"never fell ({counts})"
    if kind == "fewer-not-none" and sep and fewer and k == 0:
        return "refuted", f"prevented every fall, which 'but not none' ruled out ({counts})"
    if sep and fewer:
        return "confirmed", f"separates with fewer falls ({counts})"
    if sep and more:
        return "refuted", f"separates with more falls ({counts})"
    if kind == "holds" and k >= 1 and not fewer:
        return "refuted", f"fell, and not less often than no replay ({counts})"
    return "not decided", f"does not separate ({counts})"


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
            if arm == "gspo-r3":
                desc = (f"mean held-out area gspo-r3 {fmt(x['heldout_area'])}, "
                        f"gspo {fmt(cmp['arms']['gspo']['heldout_area'])}")
            else:
                desc = f"held-out area against no replay {t['effect']:+.3f}" if arm == "gspo" and t else ""
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
    "extension does; the other clauses read every seed the setting ran (8, or 16 when extended). 'Separates' is any of "
    "a pair's three tests (collapse counts, held-out area, drawdown) with Holm p < 0.05. lag1: 'each arm 0-1 falls of "
    "8'; 'nothing separates' (the setting is not extended and none of its tests separates). lagK: 'no replay falls on "
    "1-3 of 8'; 'R3 does not separate from no replay' (none of family A's three tests of none against r3 there "
    "separates); 'TIS falls least' (no arm falls less than tis, and one falls more). int4: 'no replay on 2-4 of 8'; "
    "'R3 on fewer (0-2)' (r3's count at most 2 and below none's, of 8); 'TIS about as no replay' (counts within one "
    "of each other, of 8); 'r3-tis fewest' (no arm falls less than r3-tis, and one falls more); 'at 8 seeds no "
    "Holm-adjusted p below 0.05' (none of the setting's tests at the first look); 'the extension rule runs seeds "
    "40-47'. With K* = 1 there is one lag setting and the lagK clauses are not tested. A clause is pending until its "
    "seeds are finished")


def _least(mine: int, others: list[int]) -> bool:
    """'falls least': no other arm falls less, and at least one falls more (all at zero is not 'least')."""
    return all(mine <= o for o in others) and any(mine < o for o in others)


def levers_grid(tests8: list[dict], tests: list[dict], counts8: dict, counts: dict, extended: list[str],
                k_star: int, preset: str, done8: set, done: set) -> dict:
    """{'lag1' | 'lagK' | 'int4': [(clause, verdict)]}. counts / counts8: {cell: (collapsed, n)} over all seeds / seeds
    32-39; tests / tests8: levers_run.grid_tests over all seeds / seeds 32-39 (each with its p_holm); done8 / done: the
    settings whose every cell finished seeds 32-39 / every seed it is planned to run."""
    def c(cell, first=True):
        return (counts8 if first else counts).get(cell, (0, 0))[0]

    def yes(ok, finished):
        return "pending" if not finished else ("confirmed" if ok else "refuted")

    def sep(tl, setting, a=None, b=None):
        return any(t["p_holm"] < 0.05 for t in tl if t["a"].startswith(setting + "/") and
                   (a is None or (t["a"], t["b"]) == (f"{setting}/{a}/n4", f"{setting}/{b}/n4")))

    out = {}
    s1 = "lag1-clip"
    out["lag1"] = [("each arm 0-1 falls of 8", yes(all(c(f"{s1}/{a}/n4") <= 1 for a in levers.LAG_ARMS),
                                                   s1 in done8)),
                   ("nothing separates", yes(s1 not in extended and not sep(tests, s1), s1 in done))]
    if k_star == 1:
        out["lagK"] = [("every clause", "not tested (K* = 1: one lag setting)")]
    else:
        sk = f"lag{k_star}-clip"
        tis, none, r3 = (c(f"{sk}/{a}/n4", False) for a in ("tis", "none", "r3"))
        out["lagK"] = [("no replay falls on 1-3 of 8", yes(1 <= c(f"{sk}/none/n4") <= 3, sk in done8)),
                       ("R3 does not separate from no replay", yes(not sep(tests, sk, "none", "r3"), sk in done)),
                       ("TIS falls least", yes(_least(tis, [none, r3]), sk in done))]
    si = f"{preset}-int4-clip"
    n8, r8, t8 = (c(f"{si}/{a}/n4") for a in ("none", "r3", "tis"))
    allc = {a: c(f"{si}/{a}/n4", False) for a in levers.LOWBIT_ARMS}
    out["int4"] = [("no replay falls on 2-4 of 8", yes(2 <= n8 <= 4, si in done8)),
                   ("R3 on fewer (0-2 of 8)", yes(r8 <= 2 and r8 < n8, si in done8)),
                   ("TIS about as no replay (within one fall of 8)", yes(abs(t8 - n8) <= 1, si in done8)),
                   ("r3-tis fewest", yes(_least(allc["r3-tis"], [v for a, v in allc.items() if a != "r3-tis"]),
                                         si in done)),
                   ("at 8 seeds no Holm-adjusted p below 0.05", yes(not sep(tests8, si), si in done8)),
                   ("the extension rule runs seeds 40-47", yes(si in extended, si in done8))]
    return out
