"""Table formatting and results files shared by the experiment scripts. (Models come from `r3.train.warmup.load_model`,
rollouts from `r3.train.collect.rollout`, metrics from `r3.train.score` / `r3.train.metrics`: every script measures with
the trainer's own code.) Every results file records its provenance (`write_results`); a table made from a dirty tree
says so."""
import os

from r3.runs.io import atomic_write, atomic_write_json
from r3.runs.provenance import markdown_line, provenance



def fmt(x, scale: float = 1.0, digits: int = 3, spec: str | None = None) -> str:
    """A table cell: '—' for None / NaN, else a compact number (or `format(x * scale, spec)` with a spec)."""
    if x is None or x != x:
        return "—"
    v = x * scale
    if spec is not None:
        return format(v, spec)
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def write_results(json_path: str, data: dict, *, md: str | None = None, t0: float | None = None,
                  git: dict | None = None) -> dict:
    """Write a results JSON (and its markdown table beside it, `md`) with the provenance of the run that made them:
    commit and dirty flag, torch, Python, threads, machine, wall time, command. Atomic writes. `git`: the checkout's
    state read when a long run started (`r3.provenance.git_state`; default: read now)."""
    prov = provenance(t0=t0, git=git)
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    atomic_write_json(json_path, dict(data, provenance=prov))
    if md is not None:
        text = md.rstrip() + "\n\n" + markdown_line(prov) + "\n"
        path = os.path.splitext(json_path)[0] + ".md"

        def write(tmp):
            with open(tmp, "w") as f:
                f.write(text)
        atomic_write(path, write)
    return prov
