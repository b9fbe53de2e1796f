"""Which kind of CPU made each run record: `python -m experiments.made_on RECORDS --report JSON [--runs RUNS]`.

A run's numbers are bit-reproducible only on the kind of CPU it was made on (docs/reproduce.md), and this project's
machine alternates between kinds, so a study whose runs span sessions mixes them; its report says how (round 5:
confirm_report.write). Records written since the sweep kept the CPU (experiments/sweep.write_record) name it in their
header; for older ones this says where the CPU was read, one source per record, the first that answers:
  record        the record's header (`cpu`; and `earlier_cpus` where the run was resumed)
  run folder    RUNS/NAME/provenance.json (the run's own stamp; `segments` for earlier processes)
  report        the CPU named by the provenance of JSON (the study's report) in the commit that added the record:
                the report was remade, at that sync, on the machine whose worktree had just finished the run. An
                inference: a run resumed across sessions may have begun on another kind
Writes OUT (default RECORDS/../made_on.json): {"records": {name: {cpu, earlier_cpus, source}}, sorted by name, and
the provenance of this command}.

  made_on(records, report, runs=None)    that dict
  kinds_lines(made)                      a report's list of {cell: {cpu: [seeds]}}: "- cell: seeds 8-10 on CPU; ..."
"""
import argparse
import glob
import json
import os
import subprocess

from experiments.common import write_results
from experiments.sweep import read_record
from r3.errors import InputError, run_main


def _git(cwd: str, *args: str) -> str | None:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def _report_cpu(report: str, path: str) -> tuple[str | None, str | None]:
    """(cpu, commit): the CPU that `report`'s provenance names in the commit that added `path`."""
    cwd = os.path.dirname(os.path.abspath(path))
    added = (_git(cwd, "log", "--diff-filter=A", "--format=%H", "--", os.path.abspath(path)) or "").split()
    if not added:
        return None, None
    top = (_git(cwd, "rev-parse", "--show-toplevel") or "").strip()
    rel = os.path.relpath(os.path.abspath(report), top)
    text = _git(top, "show", f"{added[-1]}:{rel}")
    try:
        prov = json.loads(text).get("provenance") if text else None
    except ValueError:
        prov = None
    return (prov.get("cpu") if isinstance(prov, dict) else None), added[-1]


def made_on(records: str, report: str, runs: str | None = None) -> dict:
    out = {}
    for path in sorted(glob.glob(os.path.join(records, "*.jsonl.gz"))):
        name = os.path.basename(path).removesuffix(".jsonl.gz")
        head, _ = read_record(path)
        stamp = os.path.join(runs, name, "provenance.json") if runs else None
        if head.get("cpu"):
            out[name] = dict(cpu=head["cpu"], earlier_cpus=head.get("earlier_cpus", []), source="record")
        elif stamp and os.path.exists(stamp):
            try:
                with open(stamp) as f:
                    prov = json.load(f)
                if not isinstance(prov, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as e:
                raise InputError(f"{stamp}: not a readable provenance stamp ({e})") from None
            out[name] = dict(cpu=prov.get("cpu"), earlier_cpus=[s.get("cpu") for s in prov.get("segments", [])],
                             source="run folder")
        else:
            cpu, commit = _report_cpu(report, path)
            out[name] = dict(cpu=cpu, earlier_cpus=[], source=f"report at {commit[:10]}" if commit else "unknown")
    return out


def seeds_text(seeds: list[int]) -> str:
    """'8-10, 12' for [8, 9, 10, 12]."""
    spans = []
    for s in seeds:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def kinds_lines(made: dict) -> str:
    return "\n".join(f"- {c}: " + "; ".join(f"seed{'s' if len(s) > 1 else ''} {seeds_text(s)} on {cpu}"
                                            for cpu, s in kinds.items()) for c, kinds in made.items())


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", help="a folder of run records (*.jsonl.gz)")
    p.add_argument("--report", required=True, help="the study's report JSON, whose provenance names a CPU")
    p.add_argument("--runs", default=None, help="the run folders (their provenance.json), where they still exist")
    p.add_argument("--out", default=None, help="where to write (default: made_on.json beside RECORDS)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.records):
        raise InputError(f"{args.records}: no such folder of run records")
    data = made_on(args.records, args.report, args.runs)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.records)), "made_on.json")
    write_results(out, dict(records=data))
    kinds = {}
    for v in data.values():
        kinds[v["cpu"]] = kinds.get(v["cpu"], 0) + 1
    print(f"{out}: {len(data)} records; " + "; ".join(f"{n} on {k}" for k, n in sorted(kinds.items(), key=str)))
    return data


if __name__ == "__main__":
    run_main(main)
