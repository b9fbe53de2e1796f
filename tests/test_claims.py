"""experiments.claims and the check on a kind of CPU with no exact reference: Student's t matches its tables, a
claim's interval and verdict follow from its per-seed values, the interval check passes a remake that agrees with the
committed claims and fails one that contradicts them (outside the band, a strong claim no longer supported, a
summary edited away from its values), experiments.reproduce picks exact, interval or skip by the CPU, and a tiny real
remake runs end to end on a simulated unseen CPU."""
import glob
import json
import math
import os
import subprocess
import sys

import pytest

from experiments import claims as cl
from experiments import reproduce as rp
from experiments import seed_band
from experiments.stats import noncentral_t_sf, t_cdf, t_interval, t_quantile

ROOT = rp.ROOT
UNSEEN = "Unseen CPU [avx2]"
SEEDS = list(range(8))


def test_student_t_matches_its_tables():
    assert t_quantile(0.975, 7) == pytest.approx(2.364624, abs=1e-6)
    assert t_quantile(0.975, 1) == pytest.approx(12.706205, abs=1e-5)
    assert t_quantile(0.9995, 14) == pytest.approx(4.140454, abs=1e-6)  # the band at alpha 1e-3, 8 + 8 seeds
    assert t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=1e-6)
    for df in (1, 2, 5, 8):
        assert t_cdf(0.0, df) == 0.5 and t_cdf(1.3, df) == pytest.approx(1 - t_cdf(-1.3, df), abs=1e-15)
    # no noncentrality: the central t's tail; the side rule's threshold: t = 5.99 at 8 seeds replicates w.p. 0.999
    assert noncentral_t_sf(2.0, 7, 0.0) == pytest.approx(1 - t_cdf(2.0, 7), abs=1e-8)
    assert noncentral_t_sf(t_quantile(0.975, 7), 7, 5.986882) == pytest.approx(0.999, abs=1e-6)
    half = 3.182446 * math.sqrt(5 / 3) / 2  # t(0.975, 3) * sd / sqrt(n)
    assert t_interval([1.0, 2.0, 3.0, 4.0]) == pytest.approx((2.5, 2.5 - half, 2.5 + half))


def record(name, values, seeds=SEEDS):
    return cl.claim_record(name, list(seeds), list(values))


def test_a_claims_interval_and_verdict_follow_from_its_seeds():
    c = record("r3_cut_fp8", [3, 4, 2.5, 5, 3.5, 4.2, 2.8, 3.9])
    logs = [math.log(v) for v in c["values"]]
    assert c["mean"] == pytest.approx(math.exp(sum(logs) / 8))  # geometric: a ratio's interval is on the log scale
    assert c["lo"] == pytest.approx(math.exp(t_interval(logs)[1])) and c["lo"] > 1
    assert c["verdict"] == "supported" and c["replication"] > 1 - cl.ALPHA  # strong: its side is checked elsewhere
    assert c["band"][0] < c["lo"] and c["band"][1] > c["hi"]
    assert record("moe_dense_kl_fp8", [0.5, 4, 1, 3, 0.7, 2.5, 1.2, 2])["verdict"] == "not shown"
    assert record("moe_dense_kl_fp8", [0.5, 0.4, 0.6, 0.5, 0.55, 0.45, 0.5, 0.6])["verdict"] == "contradicted"
    assert record("r3_dense_kl_fp8", [0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.1, 1.2])["verdict"] == "described"
    acc = record("quickstart_accuracy", [0.6, 0.5, 0.0, 0.7, 0.1, 0.6, 0.0, 0.4])
    assert acc["mean"] == pytest.approx(0.3625) and acc["scale"] == "linear" and acc["verdict"] == "supported"
    assert record("quickstart_accuracy", [0.0] * 8)["verdict"] == "not shown"  # no spread: still not above 0


def claims_file(**recs):
    return dict(args=dict(seeds=SEEDS), claims=recs)


def test_the_interval_check_passes_agreement_and_fails_contradiction():
    strong = [3, 4, 2.5, 5, 3.5, 4.2, 2.8, 3.9]
    weak = [1.3, 0.8, 2.1, 1.6, 0.9, 1.8, 1.1, 1.4]  # supported, but a replication would often miss it
    committed = claims_file(r3_cut_fp8=record("r3_cut_fp8", strong),
                            moe_dense_kl_fp8=record("moe_dense_kl_fp8", weak))
    assert committed["claims"]["moe_dense_kl_fp8"]["replication"] < 1 - cl.ALPHA
    names = ["r3_cut_fp8", "moe_dense_kl_fp8"]
    # another CPU's seeds: other values from the same distribution (and a weak claim no longer shown): a pass
    again = claims_file(r3_cut_fp8=record("r3_cut_fp8", [v * 1.3 for v in reversed(strong)]),
                        moe_dense_kl_fp8=record("moe_dense_kl_fp8", [v * 0.8 for v in weak]))
    assert again["claims"]["moe_dense_kl_fp8"]["verdict"] == "not shown"
    report, bad = cl.check(committed, again, names)
    assert bad == [] and len(report) == 2
    assert "side: > 1 ok" in report[0] and "side: not checked (committed replication" in report[1]
    # the remade mean far outside the band: a failure, whatever the side says
    far = claims_file(r3_cut_fp8=record("r3_cut_fp8", [v * 20 for v in strong]),
                      moe_dense_kl_fp8=record("moe_dense_kl_fp8", weak))
    (line,) = cl.check(committed, far, names)[1]
    assert line.startswith("r3_cut_fp8:") and "FAILS" in line.split("side:")[0]
    # inside the band but the strong claim's interval now holds the null: a failure of the side
    lost = claims_file(r3_cut_fp8=record("r3_cut_fp8", [0.5, 4, 1, 3, 0.7, 2.5, 1.2, 2]),
                       moe_dense_kl_fp8=record("moe_dense_kl_fp8", weak))
    (line,) = cl.check(committed, lost, names)[1]
    assert "band: " in line and " ok; side: > 1 FAILS" in line
    # a committed summary edited away from its per-seed values is refused
    edited = json.loads(json.dumps(committed))
    edited["claims"]["r3_cut_fp8"]["lo"] = 1.5
    (line,) = cl.check(edited, committed, names)[1]
    assert line == "r3_cut_fp8: the committed lo do not follow from its per-seed values"


def test_reproduce_checks_exactly_where_this_cpu_has_a_reference_else_by_claims_or_skips(monkeypatch, capsys):
    xeon = rp.made_on(os.path.join(ROOT, "results", "mismatch_table.json"))
    twin_cpus = {rp.made_on(os.path.join(ROOT, rp.CPU_REFS, d, "mismatch_table", "mismatch_table.json"))
                 for d in os.listdir(os.path.join(ROOT, rp.CPU_REFS))
                 if os.path.isdir(os.path.join(ROOT, rp.CPU_REFS, d, "mismatch_table"))}
    claims_cpu = rp.made_on(os.path.join(ROOT, "results", "claims.json"))
    for cpu in {xeon, *twin_cpus}:  # the entry's own file, or this CPU's twin: exact, as before
        monkeypatch.setattr(rp, "cpu_name", lambda cpu=cpu: cpu)
        assert {n: rp.check_kind(rp.BY_NAME[n]) for n in ("mismatch_table", "mismatch_precisions", "inspect",
                                                            "quickstart", "storage")} == dict.fromkeys(
            ("mismatch_table", "mismatch_precisions", "inspect", "quickstart", "storage"), "exact")
    monkeypatch.setattr(rp, "cpu_name", lambda: claims_cpu)
    assert rp.check_kind(rp.BY_NAME["claims"]) == "exact"
    monkeypatch.setattr(rp, "cpu_name", lambda: UNSEEN)
    kinds = {e.name: rp.check_kind(e) for e in rp.REGISTRY if not e.frozen}
    assert {n for n, k in kinds.items() if k == "claims: interval"} == {"mismatch_table", "inspect", "quickstart",
                                                                          "claims"}
    assert {n for n, k in kinds.items() if k == "seeds: band"} == {"regime"}
    assert kinds["storage"] == kinds["staleness_grid"] == kinds["regime_grid"] == "exact"  # not per CPU
    assert kinds["mismatch_precisions"].startswith("skipped: its numbers are exact per kind of CPU, made on ")
    assert "--only mismatch_precisions --cpu-reference" in kinds["mismatch_precisions"]
    assert rp.check_kind(rp.BY_NAME["quickstart"], quick=True).startswith("skipped in --quick on this kind of CPU")
    assert rp.check_kind(rp.BY_NAME["inspect"], quick=True) == "claims: interval"
    # a skipped entry runs nothing and says so
    monkeypatch.setattr(rp, "run_commands", lambda *a, **k: pytest.fail("a skipped entry ran its commands"))
    assert rp.check(rp.BY_NAME["mismatch_precisions"]) == []
    assert "[mismatch_precisions] skipped: " in capsys.readouterr().out


def test_every_entry_has_a_way_to_pass_on_a_kind_of_cpu_that_made_none_of_its_files(monkeypatch):
    """The whole registry on a simulated unseen CPU (as `R3_CHECK_AS_CPU` sets it): an entry is compared exactly
    only when it says why its numbers are the same on any CPU; a band's committed seeds exist and hold every key; a
    claim's committed record exists; everything else is skipped with its one line. So the next study cannot land an
    exact-only, model-made entry that fails on the first new CPU."""
    monkeypatch.setenv("R3_CHECK_AS_CPU", UNSEEN)
    assert rp.here() == UNSEEN
    committed = json.load(open(os.path.join(ROOT, "results", "claims.json")))["claims"]
    for e in rp.REGISTRY:
        if e.frozen or not e.checks:
            continue
        for quick in (False, True):
            kind = rp.check_kind(e, quick=quick)
            if kind == "exact":
                assert e.any_cpu, f"{e.name}: compared exactly on an unseen CPU but says nothing of why (any_cpu)"
            elif kind == "seeds: band":
                checked = {c.file for c in e.checks}
                for b in e.bands:
                    assert b.file in checked, f"{e.name}: band {b.file} is not a checked file"
                    seeds = sorted(glob.glob(os.path.join(ROOT, e.out, b.seeds)))
                    assert os.path.join(ROOT, e.out, b.file) in seeds and len(seeds) >= 2, (e.name, b.seeds)
                    for path in seeds:
                        data = json.load(open(path))
                        assert all(math.isfinite(seed_band.value(data, k.name)) for k in b.keys), path
                report, bad = seed_band.check(e.bands, os.path.join(ROOT, e.out), os.path.join(ROOT, e.out))
                assert bad == [] and len(report) == sum(len(b.keys) for b in e.bands), e.name  # seed 0 vs its own
            elif kind == "claims: interval":
                assert cl.resting_on(e.name) and set(cl.resting_on(e.name)) <= set(committed), e.name
                assert not (quick and e.quick and not e.quick_interval), e.name
            else:
                assert kind.startswith("skipped") and "\n" not in kind and "--" in kind, (e.name, kind)


def test_a_seed_band_passes_a_fresh_draw_and_fails_a_changed_number():
    key, ratio = seed_band.Key("kl", "log"), seed_band.Key("kl/kl_r3", "log", null=1.0, side=">")
    committed = [0.02, 0.025, 0.03, 0.028, 0.022, 0.027, 0.024, 0.031]
    assert seed_band.test(committed, 0.026, key, k=1)[0]
    assert seed_band.test(committed, 0.012, key, k=1)[0]  # 2.1x below the mean: a wide band, still one draw
    ok, line = seed_band.test(committed, 0.0026, key, k=1)  # ten times smaller: the code changed
    assert not ok and "FAILS" in line
    assert not seed_band.test([0.0] * 8, 1e-4, seed_band.Key("router_flip_rate"), k=1)[0]  # zero spread: equal only
    assert seed_band.test([0.0] * 8, 0.0, seed_band.Key("router_flip_rate"), k=1)[0]
    cut = [9.0, 10.0, 11.0, 12.0, 8.5, 10.5, 9.5, 11.5]
    assert seed_band.test(cut, 7.0, ratio, k=1)[0]
    ok, line = seed_band.test([1.2, 1.5, 1.1, 1.3, 1.4, 1.25, 1.35, 1.15], 0.9, ratio, k=1)
    assert ok and "side" not in line  # the committed band holds 1: no side is claimed
    assert seed_band.value(dict(kl=2.0, kl_r3=0.5), "kl/kl_r3") == 4.0


def test_every_claim_rests_on_a_checked_entry_of_the_committed_file():
    committed = json.load(open(os.path.join(ROOT, "results", "claims.json")))
    assert set(committed["claims"]) == set(cl.CLAIMS)
    assert committed["args"]["seeds"] == SEEDS
    for name, c in committed["claims"].items():
        assert c["entry"] in rp.BY_NAME and len(c["values"]) == 8, name
    assert cl.check(committed, committed, list(cl.CLAIMS))[1] == []  # each summary follows from its values


def test_a_tiny_remake_passes_on_an_unseen_cpu_and_fails_when_the_committed_claim_moves(tmp_path, monkeypatch,
                                                                                       capsys):
    path = tmp_path / "results" / "claims.json"
    cmd = [sys.executable, "-m", "experiments.claims", "--seeds", "0", "1", "2", "--prompts", "4", "--warmup-steps",
           "2", "--parts", "mismatch", "--out", str(path)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    monkeypatch.setattr(rp, "cpu_name", lambda: UNSEEN)
    entry = rp.BY_NAME["inspect"]
    assert rp.check_kind(entry, root=str(tmp_path)) == "claims: interval"
    assert rp.check(entry, root=str(tmp_path)) == []
    out = capsys.readouterr().out
    assert "[inspect] claims: interval: remaking mismatch over seeds 0 1 2" in out
    assert "inspect_flipped_ratio: committed " in out and "[inspect] claims: interval: 1 claims tested, all pass" in out
    # the committed claim moved far from what the code makes (its summary remade from the moved values): a failure
    data = json.loads(path.read_text())
    c = data["claims"]["inspect_flipped_ratio"]
    data["claims"]["inspect_flipped_ratio"] = dict(c, **cl.claim_record("inspect_flipped_ratio", c["seeds"],
                                                                         [v * 1e6 for v in c["values"]]))
    path.write_text(json.dumps(data))
    (line,) = rp.check(entry, root=str(tmp_path))  # the remade claims are reused: same settings, same process
    assert line.startswith("results/claims.json: inspect_flipped_ratio: committed ") and "FAILS" in line
    monkeypatch.setattr(rp, "check", lambda e, real=rp.check, **kw: real(e, root=str(tmp_path), **kw))
    assert rp.main(["--check", "--only", "inspect"]) == 1
    assert ("1 entries: 0 exact, 1 by interval (1 claims, 0 seed bands), 0 skipped for this kind of CPU "
            f"({UNSEEN}); 0 not checked (frozen or nothing to compare); 1 mismatches; took ") in capsys.readouterr().out


def test_a_quickstart_seed_is_train_py_r3_with_that_seed(tmp_path):
    args = cl.parse_args(["--train-flags", "--steps 2 --warmup-steps 2 --eval-prompts 4 --prompts-per-step 2 "
                                           "--group-size 2"])
    got = cl.quickstart_seed(3, args, tmp=str(tmp_path))
    assert got["quickstart_step"] == 2 and 0 <= got["quickstart_accuracy"] <= 1
    assert json.load(open(tmp_path / "quickstart-s3" / "args.json"))["seed"] == 3
