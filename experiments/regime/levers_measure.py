"""The levers' rows (levers.py fixes what they are): `python -m experiments.regime --levers`.

  row_run(row, seed, runs_dir)    (run folder, train.py flags, steps) of a row's no-replay 4-mini-step run: a lag
                                  row's (natural/none/n4 of the regime grid + --rollout-lag K, 200 steps) or a low-bit
                                  row's "after 200 steps" run (natural/none/n4 with --preset P --rollout-dtype D)
  lowbit_spec(row)                the Spec (measure.py) a low-bit row is measured under
  lag_window(rows)                a run's logged flips, kl, length and S: the means over the window's readings
  lag_probe(run_dir, k, spec)     the probe re-score at a lag run's last checkpoint: its lagged engine samples the
                                  probe batch, its trainer scores it without and with R3 (measure.py's measure)
  make_rows(out, runs_dir, seeds, jobs)   every row measurement not made yet, row by row: its runs, then them
Each measurement is one JSON in OUT/measure (made once, reused; so the command resumes), named KIND-ROW-sS:
start-ROW and after-ROW for a low-bit row, lag-ROW for a lag row; lag-lag0 (K = 0) and lag-lv3 (the lag rule's
target) are read from the regime grid's committed records and the regime table's after-200 measurements, never rerun.
The runs leave records in OUT/records, as the grid's do. Measurements run in parallel (--jobs), one thread each.
"""
import json
import os
import statistics

import torch

from experiments.regime import design, levers
from experiments.regime.calibrate import calibrate_root, measure_all
from experiments.regime.grid import cell_run
from experiments.regime.measure import CIPHER, Spec, measure, setting_spec, start_model, step_model
from experiments.rules import sustained_collapse
from experiments.sweep import read_record, run_all, same_command, set_flag, write_record
from r3.errors import InputError
from r3.rollout.engine import Engine
from r3.runs.io import read_jsonl
from r3.tasks.tasks import make_task

REGIME = os.path.join(calibrate_root(), "results", "regime")  # the regime study's records and measurements
WINDOW_KEYS = ("router_flip_rate", "token_flip_rate", "flips_per_token", "kl", "extreme_frac", "response_length",
               "entropy", "reward")
PROBE_KEYS = ("router_flip_rate", "token_flip_rate", "flips_per_token", "kl", "kl_r3", "exposure", "reward")


def lowbit_spec(row: str) -> Spec:
    preset, dtype = levers.LOWBIT_ROWS[row]
    return Spec(row, CIPHER, dtype, None, preset=preset)


def row_run(row: str, seed: int, runs_dir: str) -> tuple[str, list[str], int]:
    _, flags, _ = cell_run(levers.LAG_BASE_CELL, seed, runs_dir, levers.LAG_STEPS)
    if row in levers.LAG_ROWS:
        flags, steps = set_flag(flags, "--rollout-lag", str(levers.LAG_ROWS[row])), levers.LAG_STEPS
    elif row in levers.LOWBIT_ROWS:
        preset, dtype = levers.LOWBIT_ROWS[row]
        flags, steps = set_flag(set_flag(flags, "--preset", preset), "--rollout-dtype", dtype), design.AFTER_STEPS
    else:
        raise InputError(f"unknown lever row {row!r}: {', '.join([*levers.LAG_ROWS, *levers.LOWBIT_ROWS])}")
    return os.path.join(runs_dir, f"{row}-none-n4-s{seed}"), flags, steps


def lag_window(rows: list[dict], window: tuple[int, int] = levers.LAG_WINDOW) -> dict:
    """The means of the readings (the steps that logged the mismatch) in `window`, both ends included; S per reading
    (length x kl), then its mean."""
    sel = [r for r in rows if window[0] <= r["step"] <= window[1] and r.get("kl") is not None]
    out = {k: statistics.fmean(r[k] for r in sel) if sel and all(r.get(k) is not None for r in sel) else None
           for k in WINDOW_KEYS}
    out["exposure"] = statistics.fmean(r["response_length"] * r["kl"] for r in sel) if sel else None
    out["readings"] = len(sel)
    out["lag_logged"] = sorted({r.get("staleness/rollout_lag") for r in sel}, key=lambda x: (x is None, x))
    return out


def lag_probe(run_dir: str, k: int, spec: Spec, step: int = levers.LAG_STEPS, **kw) -> dict:
    """measure() of the trainer in `run_dir`/ckpt.pt (at `step`) with the engine that checkpoint holds (the weights of
    step - k, cast), which must be K steps behind."""
    model = step_model(run_dir, spec, step)
    state = torch.load(os.path.join(run_dir, "ckpt.pt"), map_location="cpu", weights_only=True)
    fifo = state["extra"].get("rollout_lag")
    if k and (fifo is None or fifo["k"] != k or fifo["serving_step"] != step - k):
        raise InputError(f"{run_dir}/ckpt.pt holds no --rollout-lag {k} engine serving step {step - k}")
    engine = Engine(model, spec.dtype, router_levels=spec.router_levels)
    engine.model.load_state_dict(state["engine"], strict=True)
    return dict(measure(model, make_task(spec.task), spec, engine=engine, **kw), engine_step=step - k)


def regime_rows(cell: str, seed: int) -> list[dict]:
    """The metrics of the regime grid's committed run of `cell` (steps 0-799), its flags checked."""
    path = os.path.join(REGIME, "records", f"{cell.replace('/', '-')}-s{seed}.jsonl.gz")
    head, rows = read_record(path)
    if not same_command(head["flags"], cell_run(cell, seed, "R", 0)[1]):
        raise InputError(f"{path} was not run with the regime grid's {cell} flags: {' '.join(head['flags'])}")
    return rows


def lag_result(rows: list[dict], probe: dict | None) -> dict:
    step, why = sustained_collapse([r for r in rows if r["step"] < levers.LAG_STEPS])
    out = dict(lag_window(rows), collapse_step=step, collapse_why=why, probe=probe)
    out.update({f"probe_{k}": (probe or {}).get(k) for k in PROBE_KEYS})
    return out


def _job(kind: str, name: str, seed: int, extra: dict) -> dict:
    """One measurement (runs in a worker process, one thread)."""
    torch.set_num_threads(1)
    if kind == "start":
        spec = lowbit_spec(name)
        model, task, info = start_model(spec, seed)
        return dict(measure(model, task, spec), warmup=info)
    if kind == "after":
        spec = lowbit_spec(name)
        return measure(step_model(extra["run_dir"], spec, design.AFTER_STEPS), make_task(spec.task), spec)
    if kind == "lag" and name in levers.LAG_ROWS:
        rows = read_jsonl(os.path.join(extra["run_dir"], "metrics.jsonl"))
        return lag_result(rows, lag_probe(extra["run_dir"], levers.LAG_ROWS[name], setting_spec("natural")))
    if kind == "lag" and name in ("lag0", "lv3"):  # the regime grid's runs: records, and the after-200 probe if made
        cell = levers.LAG_BASE_CELL if name == "lag0" else f"{design.STRONGEST}/none/n4"
        after = os.path.join(REGIME, "measure", f"after-{design.base_setting(cell)}-s{seed}.json")
        probe = None
        if os.path.exists(after):
            with open(after) as f:
                probe = {k: v for k, v in json.load(f).items() if k != "provenance"}
        return lag_result(regime_rows(cell, seed), probe)
    raise ValueError(f"{kind} {name}")


def missing(out: str, kind: str, row: str, seed: int) -> bool:
    return not os.path.exists(os.path.join(out, "measure", f"{kind}-{row}-s{seed}.json"))


def make_rows(out: str, runs_dir: str, seeds, jobs: int) -> dict:
    """Every row measurement of `seeds`: the low-bit starts (the warm-ups) and K = 0 and lv3 from the regime study's
    files, then row by row the runs whose measurement is not made yet (with their records) and at once their
    measurements, so a row is measured as soon as its runs are done and a stopped command loses no finished row."""
    res = measure_all(out, [("start", r, s, {}) for r in levers.LOWBIT_ROWS for s in seeds]
                      + [("lag", r, s, {}) for r in ("lag0", "lv3") for s in seeds], jobs, job=_job)
    kind = lambda row: "after" if row in levers.LOWBIT_ROWS else "lag"  # noqa: E731
    for row in [*levers.LAG_ROWS, *levers.LOWBIT_ROWS]:
        todo = {s: row_run(row, s, runs_dir) for s in seeds if missing(out, kind(row), row, s)}
        if not todo:
            continue
        print(f"row {row}: {len(todo)} runs of {len(seeds)} seeds to make, then measure", flush=True)
        run_all(list(todo.values()), jobs=jobs, log_dir=os.path.join(runs_dir, "logs"))
        for run_dir, _, _ in todo.values():
            write_record(run_dir, os.path.join(out, "records"))
        res.update(measure_all(out, [(kind(row), row, s, dict(run_dir=todo[s][0])) for s in todo], jobs, job=_job))
    return res
