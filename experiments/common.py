"""Table formatting shared by the experiment scripts. (Models come from `r3.warmup.load_model`, rollouts from
`r3.tasks.rollout`, metrics from `r3.score` / `r3.metrics`: every script measures with the trainer's own code.)"""


def fmt(x, scale: float = 1.0, digits: int = 3) -> str:
    """A table cell: '—' for None / NaN, else a compact number."""
    if x is None or x != x:
        return "—"
    v = x * scale
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
