"""experiments.reproduce: its registry covers every committed results file once, every results JSON records its
provenance, the comparison applies each key's tolerance, and a changed committed number makes --check fail naming the
file, the key and both values (on a temp copy; the committed files are never edited)."""
import fnmatch
import json
import os
import shutil
import subprocess

import pytest

from experiments import reproduce as rp
from experiments.reproduce import BY_NAME, REGISTRY, Check, compare

ROOT = rp.ROOT


def committed_results() -> list[str]:
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "results"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return out.stdout.split()


def owners(path: str) -> list[str]:
    """Entries whose file patterns (relative to their folder, at the same depth: `*` never crosses a `/`) match; a
    per-CPU twin (results/cpu/SLUG/ENTRY/FILE) belongs to ENTRY when FILE is one it checks."""
    parts = path.split("/")
    if path.startswith(rp.CPU_REFS + "/"):
        return [e.name for e in REGISTRY if len(parts) >= 5 and e.name == parts[3]
                and "/".join(parts[4:]) in [c.file for c in e.checks]]

    def match(e, pattern):
        rel = os.path.relpath(path, e.out)
        return not rel.startswith("..") and rel.count("/") == pattern.count("/") and fnmatch.fnmatch(rel, pattern)
    return [e.name for e in REGISTRY for pattern in e.files if match(e, pattern)]


def test_every_committed_results_file_has_exactly_one_entry():
    files = committed_results()
    assert files
    assert {f: owners(f) for f in files if len(owners(f)) != 1} == {}


def test_every_entry_names_files_that_exist_and_checks_its_own_json():
    for e in REGISTRY:
        for pattern in e.files:
            assert any(fnmatch.fnmatch(f, os.path.join(e.out, pattern)) for f in committed_results()), (e.name, pattern)
        assert [c.file for c in e.checks if c.file not in e.files] == [], e.name
        assert e.frozen or e.checks, f"{e.name}: a live entry must check something"
        assert not (e.frozen and e.quick), e.name
        assert e.commands and (e.wall_s or 0) > 0 or e.frozen


def test_quick_check_fits_in_about_fifteen_minutes_and_covers_the_readme_job_mismatch_table_and_storage():
    quick = [e for e in REGISTRY if e.quick]  # CI runs them after the tests (~12 min): both within its 30
    assert {"quickstart", "mismatch_table", "storage"} <= {e.name for e in quick}
    assert sum(e.check_wall_s or e.wall_s for e in quick) <= 900


def test_every_results_json_records_its_provenance():
    for f in committed_results():
        if f.endswith(".json"):
            prov = json.load(open(os.path.join(ROOT, f))).get("provenance")
            assert prov is not None, f
            assert {"commit", "dirty", "command", "torch"} <= set(prov), f
            assert len(prov["commit"]) == 40, f
            assert prov["torch"] is not None or "reconstructed" in prov, f  # older files say what is unknown


def test_compare_applies_each_tolerance():
    c = Check("x.json", (("t*", "skip", "timing"), ("r", ("rel", 1e-3), "r"), ("a", ("abs", 0.5), "a")))
    base = dict(t_ms=1.0, r=1000.0, a=1.0, n=float("nan"), rows=[dict(name="MoE", kl=0.5)], flag=True, none=None,
                label="strings are not compared", provenance=dict(commit="x"))
    assert compare(c, base, dict(base)) == (6, [])
    near = dict(base, t_ms=99.0, r=1000.9, a=1.4, label="other", provenance={})
    assert compare(c, base, near)[1] == []
    far = dict(base, r=1002.0, a=1.6, rows=[dict(name="MoE", kl=0.6)], flag=False, none=0.0)
    assert [m[0] for m in compare(c, base, far)[1]] == ["a", "flag", "none", "r", "rows[0] (name=MoE).kl"]
    gone = {k: v for k, v in base.items() if k != "a"}
    assert compare(c, base, gone)[1] == [("a", 1.0, "<absent>", "a key on one side only")]


def test_unknown_entry_and_remake_of_a_frozen_entry_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        rp.main(["--only", "nope"])
    assert e.value.code == 2 and "unknown entry 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="frozen"):
        rp.main(["--only", "earlier_toy_sort"])


def copy_committed(entry, root):
    for pattern in entry.files:
        dest = root / entry.out
        dest.mkdir(parents=True, exist_ok=True)
        for name in fnmatch.filter(os.listdir(os.path.join(ROOT, entry.out)), pattern):
            shutil.copy(os.path.join(ROOT, entry.out, name), dest / name)


def test_check_passes_on_the_committed_files_and_names_a_changed_number(tmp_path):
    entry = BY_NAME["storage"]  # the cheapest live entry: seconds
    good, bad = tmp_path / "good", tmp_path / "bad"
    copy_committed(entry, good)
    copy_committed(entry, bad)
    assert rp.check(entry, root=str(good)) == []
    path = bad / entry.out / "storage.json"
    data = json.loads(path.read_text())
    committed = data["rows"][7]["sample_bytes"]
    data["rows"][7]["sample_bytes"] = committed + 1
    path.write_text(json.dumps(data, indent=1))
    lines = rp.check(entry, root=str(bad))
    assert len(lines) == 1
    assert lines[0].startswith("results/storage.json: rows[7] (geometry=256e-top8, codec=")
    assert ".sample_bytes: " in lines[0]
    assert f"committed {committed + 1}, recomputed {committed}" in lines[0]


def test_check_command_exits_non_zero_on_a_mismatch(tmp_path, monkeypatch, capsys):
    entry = BY_NAME["storage"]
    copy_committed(entry, tmp_path)
    path = tmp_path / entry.out / "storage.json"
    data = json.loads(path.read_text())
    data["rows"][0]["vs_int32"] = 3.5
    path.write_text(json.dumps(data, indent=1))
    real = rp.check
    monkeypatch.setattr(rp, "check", lambda e, **kw: real(e, root=str(tmp_path), **kw))
    assert rp.main(["--check", "--only", "storage"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH results/storage.json: rows[0] (geometry=Qwen3-30B-A3B, codec=bool_mask" in out
    assert "committed 3.5, recomputed 4.0" in out


def test_the_docs_list_the_registry():
    text = open(os.path.join(ROOT, "docs", "reproduce.md")).read()
    assert rp.listing() in text


def test_a_mismatch_names_the_cpu_a_file_was_made_on_when_it_is_not_this_one(tmp_path):
    from r3.runs.provenance import cpu_name
    e = BY_NAME["storage"]
    path = tmp_path / e.out / e.checks[0].file
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dict(provenance=dict(cpu=cpu_name()))))
    assert rp.cpu_hint(e, root=str(tmp_path)) is None  # made here: a mismatch is the code's
    path.write_text(json.dumps(dict(provenance=dict(cpu="Another CPU [avx2]"))))
    hint = rp.cpu_hint(e, root=str(tmp_path))
    assert "storage.json was made on Another CPU [avx2], checked here on " + cpu_name() in hint
    assert "--only storage" in hint
    path.write_text(json.dumps(dict(provenance={})))  # made before provenance named the CPU
    assert "a CPU its provenance does not name" in rp.cpu_hint(e, root=str(tmp_path))
    path.write_text(json.dumps(dict(provenance=None)))  # an odd file: a hint, not a crash
    assert "a CPU its provenance does not name" in rp.cpu_hint(e, root=str(tmp_path))
    path.write_text(json.dumps([1, 2]))
    assert "a CPU its provenance does not name" in rp.cpu_hint(e, root=str(tmp_path))


def test_a_check_compares_with_this_cpus_twin_when_the_entrys_file_was_made_on_another(tmp_path, capsys):
    from r3.runs.provenance import cpu_name
    e = BY_NAME["storage"]
    copy_committed(e, tmp_path)
    own = tmp_path / e.out / "storage.json"
    data = json.loads(own.read_text())
    twin = tmp_path / rp.CPU_REFS / rp.cpu_slug() / "storage" / "storage.json"
    twin.parent.mkdir(parents=True)
    twin.write_text(json.dumps(dict(data, provenance=dict(data["provenance"], cpu=cpu_name()))))
    # the entry's own file, made on another CPU, holds other numbers: the twin made here decides
    data["rows"][0]["vs_int32"] = 3.5
    own.write_text(json.dumps(dict(data, provenance=dict(data["provenance"], cpu="Another CPU [avx2]"))))
    assert rp.reference(e, "storage.json", root=str(tmp_path)) == str(twin)
    assert rp.check(e, root=str(tmp_path)) == []
    assert f"compared with {rp.CPU_REFS}/{rp.cpu_slug()}/storage/storage.json" in capsys.readouterr().out
    # a twin that no longer matches the code is a mismatch like any committed file
    twin_data = json.loads(twin.read_text())
    twin_data["rows"][1]["vs_int32"] = 9.5
    twin.write_text(json.dumps(twin_data))
    (line,) = rp.check(e, root=str(tmp_path))
    assert line.startswith(f"{rp.CPU_REFS}/{rp.cpu_slug()}/storage/storage.json: rows[1]") and "committed 9.5" in line
    # made here, the entry's own file is compared and the twin ignored
    own.write_text(json.dumps(dict(data, provenance=dict(data["provenance"], cpu=cpu_name()))))
    assert rp.reference(e, "storage.json", root=str(tmp_path)) == str(own)
    twin.unlink()  # no twin for this CPU: the entry's own file, whatever made it
    own.write_text(json.dumps(dict(data, provenance=dict(data["provenance"], cpu="Another CPU [avx2]"))))
    assert rp.reference(e, "storage.json", root=str(tmp_path)) == str(own)


def test_cpu_slug_is_a_folder_name():
    assert rp.cpu_slug("AMD EPYC [avx2 avx512f avx512_bf16]") == "amd-epyc-avx2-avx512f-avx512_bf16"
    assert rp.cpu_slug("Intel(R) Xeon(R) Processor [avx2 amx_bf16]") == "intel-r-xeon-r-processor-avx2-amx_bf16"


def test_cpu_reference_needs_only_and_is_refused_where_this_cpu_made_the_entrys_file(capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        rp.main(["--cpu-reference"])
    assert e.value.code == 2 and "--cpu-reference needs --only NAME" in capsys.readouterr().err
    monkeypatch.setattr(rp, "made_on", lambda path: rp.cpu_name())
    with pytest.raises(SystemExit, match="was made on this kind of CPU .*remake it with --only storage"):
        rp.main(["--only", "storage", "--cpu-reference"])


def test_check_jobs_runs_entries_at_once_longest_first_and_reports_in_registry_order(monkeypatch):
    """--jobs 2: two checks are under way together (each waits at a barrier the other must reach: a serial run would
    end there with BrokenBarrierError after 600 s, a guard against a hang, not a timing), the longest expected first;
    the mismatch lines come back in the registry's order, whatever order the checks end in."""
    import threading
    entries = [BY_NAME[n] for n in ("storage", "quickstart", "overhead", "mismatch_table")]
    started, barrier = [], threading.Barrier(2, timeout=600)

    def fake(entry, quick=False):
        started.append(entry.name)
        if len(started) <= 2:
            barrier.wait()
        return [f"{entry.name}: bad"]
    monkeypatch.setattr(rp, "check", fake)
    got = rp.check_all(entries, True, 2)
    assert got == [[f"{e.name}: bad"] for e in entries]
    walls = {e.name: e.check_wall_s or e.wall_s for e in entries}
    assert sorted(started[:2], key=lambda n: -walls[n]) == sorted(walls, key=lambda n: -walls[n])[:2]
    assert rp.check_all(entries, True, 1) == got  # one at a time: the same lines
    with pytest.raises(SystemExit):
        rp.main(["--check", "--quick", "--jobs", "0"])
