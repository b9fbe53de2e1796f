"""What this proves: the predictions' verdicts follow their fixed rules (experiments/regime/verdicts.py) from the counts
and the Holm-adjusted tests of family A (never family B's), each outcome reachable: an 'about as no replay' prediction
can only be refuted, by a separation either way (16 seeds cannot show two rates equal); 'holds' is confirmed by no
fall or a separation and refuted by falling at least as often as no replay; IcePop's 'but not none' is refuted by
preventing every fall; nothing is decided while runs are missing; the levers' clauses read the first eight seeds where
they say 'of 8', ties count for 'fewest' only when some arm falls more, and K* = 1 leaves the lagK clauses untested."""
import pytest

from experiments.regime import verdicts
from experiments.stats import fisher_exact, holm


def verdict(kind, k, k0, n=16):
    return verdicts._verdict(kind, k, n, k0, n, fisher_exact(k, n, k0, n))[0]


@pytest.mark.parametrize("kind,k,k0,expected", [
    ("as-none", 1, 1, "not decided"),    # 16 seeds cannot show two rates equal: this prediction can only fail
    ("as-none", 3, 1, "not decided"),
    ("as-none", 0, 10, "refuted"),       # separates (fewer)
    ("as-none", 12, 1, "refuted"),       # separates (more)
    ("not-better", 0, 3, "not decided"),
    ("not-better", 12, 1, "not decided"),  # worse is not better
    ("not-better", 0, 10, "refuted"),
    ("holds", 0, 0, "confirmed"),        # never fell
    ("holds", 1, 12, "confirmed"),       # separates with fewer
    ("holds", 1, 1, "refuted"),          # fell, and not less often: neither 'no falls' nor 'far fewer'
    ("holds", 2, 1, "refuted"),
    ("holds", 12, 1, "refuted"),         # separates with more
    ("holds", 1, 3, "not decided"),
    ("fewer", 0, 0, "not decided"),      # nothing fell anywhere
    ("fewer", 1, 1, "not decided"),
    ("fewer", 2, 12, "confirmed"),
    ("fewer", 12, 2, "refuted"),         # separates with more falls
    ("fewer-not-none", 2, 12, "confirmed"),
    ("fewer-not-none", 0, 12, "refuted"),  # prevented every fall, which 'but not none' ruled out
    ("fewer-not-none", 0, 2, "not decided"),
])
def test_each_kind_reaches_its_verdicts(kind, k, k0, expected):
    assert verdict(kind, k, k0) == expected


def comparison(counts: dict, n: int = 16, complete: bool = True) -> tuple[dict, dict]:
    """confirm_report.comparison-shaped output: family A's collapse tests Holm-adjusted over its 8 arms, and family B
    rows that all separate (the verdicts must not read them)."""
    arms = {a: dict(collapsed=k, n=n, heldout_area=0.5) for a, k in counts.items()}
    fam = [a for a in counts if a != "none"]
    ps = holm([fisher_exact(counts[a], n, counts["none"], n) for a in fam])
    tests = [dict(family="A", arm=a, metric="collapsed", p_holm=q) for a, q in zip(fam, ps)]
    tests += [dict(family="B", arm=a, metric="collapsed", p_holm=0.0) for a in fam if a != "r3"]
    tests += [dict(family="A", arm=a, metric="heldout_area", effect=0.01, p_holm=0.0) for a in fam]
    cmp = dict(arms=arms, tests=tests, complete=complete, runs=9 * n, total=144)
    conf = dict(complete=complete, runs=96, total=96, rows=[
        dict(setting="lv3-clip", confirmed=True, collapsed_r3=0, rate_none_ci=(0.2, 0.6)),
        dict(setting="lv3", confirmed=True, collapsed_r3=0, rate_none_ci=(0.3, 0.7))])
    return cmp, conf


def test_the_comparison_reads_family_a_and_marks_the_untested_parts():
    counts = dict(none=9, tis=8, icepop=0, mis=9, r2=12, r3=0, **{"r3-tis": 0, "gspo": 3, "gspo-r3": 1})
    out = verdicts.compare(*comparison(counts))
    assert out["r3"]["verdict"] == out["r3-tis"]["verdict"] == out["gspo-r3"]["verdict"] == "confirmed"
    assert out["icepop"]["verdict"] == "refuted"  # 0 of 16 against 9: prevented every fall
    assert out["tis"]["verdict"] == out["mis"]["verdict"] == out["r2"]["verdict"] == "not decided"
    assert out["gspo"]["verdict"] == "not decided"  # 3 against 9 of 16: Fisher p 0.07 before Holm over 8 arms
    assert "not_tested" in out["gspo"] and "not_tested" in out["gspo-r3"] and "not_tested" not in out["tis"]
    assert out["confirmation"]["verdict"] == "confirmed"  # 40 % and 35 % both inside their intervals
    out = verdicts.compare(*comparison(counts | dict(tis=1, gspo=13)))
    assert out["tis"]["verdict"] == "refuted" and out["gspo"]["verdict"] == "not decided"  # 13 vs 9: no separation


def test_nothing_is_decided_while_runs_are_missing():
    cmp, conf = comparison(dict.fromkeys(verdicts.KINDS, 0) | {"none": 9}, n=11, complete=False)
    out = verdicts.compare(cmp, conf)
    assert {v["verdict"] for v in out.values()} == {"pending"}


def test_the_confirmations_prediction_fails_on_any_clause():
    cmp, conf = comparison(dict.fromkeys(verdicts.KINDS, 0) | {"none": 9})
    conf["rows"][0]["rate_none_ci"] = (0.02, 0.2)  # no replay fell far less often than the predicted 40 %
    out = verdicts.compare(cmp, conf)["confirmation"]
    assert out["verdict"] == "refuted" and "no replay about 40% at lv3-clip (Wilson [0.02, 0.20]): no" in out["why"]


def lever_tests(seps: dict) -> list[dict]:
    """grid_tests-shaped rows: {(a, b): p_holm} of collapse tests."""
    return [dict(a=a, b=b, metric="collapsed", p_holm=p) for (a, b), p in seps.items()]


def test_the_levers_clauses_read_the_first_look_where_they_say_of_8():
    s = "qwen3-ratio-int4-clip"
    counts8 = {f"lag1-clip/{a}/n4": (k, 8) for a, k in dict(none=1, r3=0, tis=1).items()}
    counts8 |= {f"lag8-clip/{a}/n4": (k, 8) for a, k in dict(none=2, r3=1, tis=0).items()}
    counts8 |= {f"{s}/{a}/n4": (k, 8) for a, k in {"none": 3, "r3": 1, "tis": 3, "r3-tis": 0}.items()}
    counts = dict(counts8) | {f"{s}/{a}/n4": (k, 16) for a, k in {"none": 7, "r3": 1, "tis": 6, "r3-tis": 0}.items()}
    tests8 = lever_tests({(f"{s}/none/n4", f"{s}/r3/n4"): 0.6, ("lag8-clip/none/n4", "lag8-clip/r3/n4"): 1.0})
    tests = lever_tests({(f"{s}/none/n4", f"{s}/r3/n4"): 0.04, ("lag8-clip/none/n4", "lag8-clip/r3/n4"): 1.0})
    every = {"lag1-clip", "lag8-clip", s}
    out = verdicts.levers_grid(tests8, tests, counts8, counts, [s], 8, "qwen3-ratio", every, every)
    v = {name: dict(clauses) for name, clauses in out.items()}
    assert set(v["lag1"].values()) == {"confirmed"}
    assert v["lagK"] == {"no replay falls on 1-3 of 8": "confirmed", "R3 does not separate from no replay": "confirmed",
                         "TIS falls least": "confirmed"}
    assert v["int4"]["no replay falls on 2-4 of 8"] == "confirmed"  # 3 of the first 8, though 7 of 16 in all
    assert v["int4"]["at 8 seeds no Holm-adjusted p below 0.05"] == "confirmed"  # the final p 0.04 is not the look's
    assert v["int4"]["the extension rule runs seeds 40-47"] == "confirmed"
    pending = verdicts.levers_grid(tests8, tests, counts8, counts, [], 8, "qwen3-ratio", every, every - {"lag1-clip"})
    assert dict(pending["lag1"])["nothing separates"] == "pending"
    assert dict(pending["int4"])["no replay falls on 2-4 of 8"] == "confirmed"  # its eight seeds are in
    counts8[f"{s}/tis/n4"] = (5, 8)
    out = verdicts.levers_grid(tests8, tests, counts8, counts, [s], 8, "qwen3-ratio", every, every)
    assert dict(out["int4"])["TIS about as no replay (within one fall of 8)"] == "refuted"
    tests.append(dict(a="lag8-clip/none/n4", b="lag8-clip/r3/n4", metric="heldout_area", p_holm=0.01))
    out = verdicts.levers_grid(tests8, tests, counts8, counts, [s], 8, "qwen3-ratio", every, every)
    assert dict(out["lagK"])["R3 does not separate from no replay"] == "refuted"  # on held-out area, not counts
    assert verdicts.levers_grid(tests8, tests, counts8, counts, [s], 1, "qwen3-ratio", every, every)["lagK"] == \
        [("every clause", "not tested (K* = 1: one lag setting)")]
