"""What this proves: experiments.made_on names the kind of CPU that made each run record, from the first source that
answers: the record's header (what experiments/sweep.py writes now, with the earlier processes' CPUs of a resumed
run), the run folder's provenance.json, or the study report's provenance in the commit that added the record; round
5's report lists, per cell, the seeds each kind made; a missing folder is one line and exit 1."""
import gzip
import json
import os
import subprocess
import sys

import pytest

from experiments.made_on import made_on
from experiments.regime.confirm_report import made_on_seeds
from r3.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XEON, EPYC = "Intel(R) Xeon(R) [amx_bf16]", "AMD EPYC [avx2]"


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def record(path, name, **head):
    with gzip.open(path / f"{name}.jsonl.gz", "wt") as f:
        f.write(json.dumps(dict(record=1, name=name, flags=[], done={}, commit="c", **head)) + "\n")


def test_each_record_gets_its_cpu_from_the_first_source_that_answers(tmp_path):
    study, records, runs = tmp_path / "study", tmp_path / "study" / "records", tmp_path / "runs"
    records.mkdir(parents=True)
    git(tmp_path, "init", "-q")
    record(records, "old-s0")  # made before records named their CPU, synced with a report made on the Xeon
    (study / "report.json").write_text(json.dumps(dict(provenance=dict(cpu=XEON))))
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "sync 1")
    record(records, "old-s1")  # the next sync's report was made on the EPYC
    (study / "report.json").write_text(json.dumps(dict(provenance=dict(cpu=EPYC))))
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "sync 2")
    record(records, "folder-s0")  # not committed yet; its run folder still exists
    (runs / "folder-s0").mkdir(parents=True)
    (runs / "folder-s0" / "provenance.json").write_text(json.dumps(dict(cpu=EPYC, segments=[dict(cpu=XEON)])))
    record(records, "new-s0", cpu=XEON, earlier_cpus=[EPYC])  # what sweep.write_record writes now
    record(records, "lost-s0")  # neither committed nor with a folder
    got = made_on(str(records), str(study / "report.json"), str(runs))
    assert {k: (v["cpu"], v["earlier_cpus"]) for k, v in got.items()} == {
        "old-s0": (XEON, []), "old-s1": (EPYC, []), "folder-s0": (EPYC, [XEON]), "new-s0": (XEON, [EPYC]),
        "lost-s0": (None, [])}
    assert got["old-s0"]["source"].startswith("report at ") and got["folder-s0"]["source"] == "run folder"
    assert got["new-s0"]["source"] == "record" and got["lost-s0"]["source"] == "unknown"
    assert got["old-s0"]["source"] != got["old-s1"]["source"]  # each names the commit that added it
    (runs / "folder-s0" / "provenance.json").write_text("{cut")
    with pytest.raises(InputError, match="folder-s0/provenance.json: not a readable provenance stamp"):
        made_on(str(records), str(study / "report.json"), str(runs))


def test_the_report_lists_the_seeds_each_kind_made(tmp_path):
    table = tmp_path / "made_on.json"
    table.write_text(json.dumps(dict(records={"a-s8": dict(cpu=XEON), "a-s9": dict(cpu=XEON),
                                              "a-s11": dict(cpu=EPYC)})))
    done = {"a": {8: (dict(name="a-s8"), []), 9: (dict(name="a-s9"), []), 10: (dict(name="a-s10", cpu=XEON), []),
                  11: (dict(name="a-s11"), [])},
            "b": {8: (dict(name="b-s8"), [])}}
    assert made_on_seeds(done, str(table)) == {"a": {EPYC: [11], XEON: [8, 9, 10]}, "b": {"unknown": [8]}}


def test_a_missing_folder_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.made_on", str(tmp_path / "nope"), "--report", "x.json"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "no such folder of run records" in r.stderr
