"""What this proves: the predictions' verdicts follow their fixed rules (experiments/regime/verdicts.py) from the
counts and the Holm-adjusted tests, each outcome reachable: an 'about as no replay' prediction is refuted by a
separation either way and confirmed only by an interval inside the margin; 'holds' is confirmed by no fall or a
separation and refuted by a fall whose interval leaves no cut of 0.25; IcePop's 'but not none' is refuted by
preventing every fall; nothing is decided while runs are missing; the levers' clauses read the first eight seeds where they say 'of 8'."""
import pytest

from experiments.regime import verdicts
from experiments.stats import fisher_exact


def verdict(kind, k, k0, n=16):
    return verdicts._verdict(kind, k, n, k0, n, fisher_exact(k, n, k0, n))[0]


@pytest.mark.parametrize("kind,k,k0,expected", [
    ("as-none", 1, 1, "confirmed"),      # [-0.23, +0.23] inside ±0.25
    ("as-none", 3, 1, "not decided"),    # [-0.13, +0.37]: too wide to call equal, too close to call different
    ("as-none", 0, 10, "refuted"),       # separates (fewer)
    ("as-none", 12, 1, "refuted"),       # separates (more)
    ("not-better", 3, 1, "confirmed"),   # a cut of 0.25 is ruled out
    ("not-better", 0, 3, "not decided"),  # [-0.43, +0.04]
    ("not-better", 0, 10, "refuted"),
    ("holds", 0, 0, "confirmed"),        # never fell
    ("holds", 1, 12, "confirmed"),       # separates with fewer
    ("holds", 1, 1, "refuted"),          # fell, and no cut of 0.25 is left
    ("holds", 1, 3, "not decided"),
    ("fewer", 0, 0, "not decided"),      # nothing fell anywhere: cannot be fewer, not refuted by a fall either
    ("fewer", 2, 12, "confirmed"),
    ("fewer", 1, 1, "refuted"),          # fell, and [-0.23, +0.23] rules out a cut of 0.25
    ("fewer", 2, 2, "not decided"),      # [-0.252, +0.252]: a cut of 0.25 is still open
    ("fewer", 12, 2, "refuted"),         # separates with more falls
    ("fewer-not-none", 2, 12, "confirmed"),
    ("fewer-not-none", 0, 12, "refuted"),  # prevented every fall, which 'but not none' ruled out
    ("fewer-not-none", 0, 2, "not decided"),
])
def test_each_kind_reaches_its_verdicts(kind, k, k0, expected):
    assert verdict(kind, k, k0) == expected


def comparison(counts: dict, n: int = 16, complete: bool = True) -> tuple[dict, dict]:
    arms = {a: dict(collapsed=k, n=n, heldout_area=0.5) for a, k in counts.items()}
    tests = [dict(family="A", arm=a, metric="collapsed", p_holm=min(1.0, 7 * fisher_exact(k, n, counts["none"], n)))
             for a, k in counts.items() if a != "none"]
    tests += [dict(family="A", arm=a, metric="heldout_area", effect=0.01) for a in counts if a != "none"]
    cmp = dict(arms=arms, tests=tests, complete=complete, runs=9 * n, total=144)
    conf = dict(complete=complete, runs=96, total=96, rows=[
        dict(setting="lv3-clip", confirmed=True, collapsed_r3=0, rate_none_ci=(0.2, 0.6)),
        dict(setting="lv3", confirmed=True, collapsed_r3=0, rate_none_ci=(0.3, 0.7))])
    return cmp, conf


def test_the_comparison_reads_family_a_and_marks_the_untested_parts():
    counts = dict(none=9, tis=8, icepop=0, mis=9, r2=12, r3=0, **{"r3-tis": 0, "gspo": 3, "gspo-r3": 1})
    out = verdicts.compare(*comparison(counts))
    assert out["r3"]["verdict"] == out["r3-tis"]["verdict"] == out["gspo-r3"]["verdict"] == "confirmed"
    assert out["icepop"]["verdict"] == "refuted" and out["tis"]["verdict"] == "not decided"
    assert out["r2"]["verdict"] == "confirmed" and out["gspo"]["verdict"] == "not decided"  # Holm over 7 arms
    assert verdicts.compare(*comparison(counts | dict(r2=10)))["r2"]["verdict"] == "not decided"  # [-0.253, ...]
    assert "not_tested" in out["gspo"] and "not_tested" in out["gspo-r3"] and "not_tested" not in out["tis"]
    assert out["confirmation"]["verdict"] == "confirmed"  # 40 % and 35 % both inside their intervals


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
    out = verdicts.levers_grid(tests8, tests, counts8, counts, [s], 8, "qwen3-ratio", True, True)
    v = {name: dict(clauses) for name, clauses in out.items()}
    assert set(v["lag1"].values()) == {"confirmed"}
    assert v["lagK"] == {"no replay falls on 1-3 of 8": "confirmed", "R3 does not separate from no replay": "confirmed",
                         "TIS falls least": "confirmed"}
    assert v["int4"]["no replay falls on 2-4 of 8"] == "confirmed"  # 3 of the first 8, though 7 of 16 in all
    assert v["int4"]["at 8 seeds no Holm-adjusted p below 0.05"] == "confirmed"  # the final p 0.04 is not the look's
    assert v["int4"]["the extension rule runs seeds 40-47"] == "confirmed"
    pending = verdicts.levers_grid(tests8, tests, counts8, counts, [], 8, "qwen3-ratio", True, False)
    assert dict(pending["lag1"])["nothing separates"] == "pending"
    assert dict(pending["int4"])["no replay falls on 2-4 of 8"] == "confirmed"  # its eight seeds are in
    counts8[f"{s}/tis/n4"] = (5, 8)
    out = verdicts.levers_grid(tests8, tests, counts8, counts, [s], 8, "qwen3-ratio", True, True)
    assert dict(out["int4"])["TIS about as no replay (within one fall of 8)"] == "refuted"
