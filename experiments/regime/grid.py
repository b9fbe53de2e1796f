"""The dose-response grid's runs and numbers: `python -m experiments.regime --grid` (design.py fixes what is run).

  cell_run(cell, seed, ...)    (run folder, train.py flags, steps) of one run of cell SETTING/ARM/nN
  run_row(head, rows)          a run's numbers (RULE_TEXT): collapse step, best / final held-out, held-out area,
                               largest drawdown, max grad norm, mean kl and its trend, flips over training; and,
                               descriptive (added after the grid began, no test reads them), the median over steps of
                               the step's largest |log r| of a sampled token and the steps where it passed 10
  compare(cells, paper)        TESTS_TEXT's pairs: Fisher on collapse counts, paired permutation on held-out area and
                               drawdown
  answer(ts)                   the Holm-corrected reading at 4 mini-steps and SELECTION_TEXT's pick
Runs are the sweep's (experiments/sweep.py): resumable, records in OUT/records that the tables are made from.
"""
import math
import os
import statistics

from experiments.regime import design
from experiments.rules import max_drawdown, sustained_collapse
from experiments.stats import TOL, fisher_exact, holm, paired_permutation_test, t_interval
from experiments.sweep import set_flag


def setting_flags(setting: str, *, paper: str | None, walk_T: int | None) -> list[str]:
    """The flags that make SETTING (on top of design.COMMON)."""
    base, _, variant = setting.partition("-")
    if base in design.POSITIONS:
        points = design.POSITIONS[base]
        flags = ["--rollout-dtype", design.ENGINE] + ([] if points is None else ["--router-levels", str(points)])
    elif base == "oracle":
        flags = ["--rollout-dtype", "fp32"]
    elif base == "deep":
        flags = ["--preset", "qwen3-routing", "--rollout-dtype", design.ENGINE]
    elif base == "walk":
        if paper is None or walk_T is None:
            raise ValueError("the walk setting needs the paper-matched position and T")
        flags = ["--task", f"walk:{walk_T}"] + setting_flags(paper, paper=None, walk_T=None)
    else:
        raise ValueError(f"unknown setting {setting!r}")
    if variant == "clip":
        for name, value in design.CLIP_FLAGS:
            flags = set_flag(flags, name, value)
    elif variant:
        raise ValueError(f"unknown setting variant {variant!r} in {setting!r}")
    return flags


def cell_run(cell: str, seed: int, runs_dir: str, steps: int, *, paper: str | None = None,
             walk_T: int | None = None) -> tuple[str, list[str], int]:
    setting, arm, n = cell.split("/")
    flags = design.COMMON.split()
    for i in range(0, len(extra := setting_flags(setting, paper=paper, walk_T=walk_T)), 2):
        flags = set_flag(flags, extra[i], extra[i + 1])
    flags += ["--replay", arm, "--mini-steps", n[1:], "--seed", str(seed)]
    return os.path.join(runs_dir, f"{setting}-{arm}-{n}-s{seed}"), flags, steps


def _mean(xs):
    xs = [x for x in xs if x is not None and x == x]
    return sum(xs) / len(xs) if xs else None


def kl_trend(rows: list[dict], window: int = 100) -> float | None:
    """log10(mean kl of the last `window` steps / of the first `window`), over the steps that measured it."""
    first = _mean([r.get("kl") for r in rows if r["step"] < window])
    last = _mean([r.get("kl") for r in rows if r["step"] >= rows[-1]["step"] + 1 - window])
    return math.log10(last / first) if first and last and first > 0 and last > 0 else None


def run_row(commit: str | None, rows: list[dict]) -> dict:
    step, why = sustained_collapse(rows)
    accs = [r["eval/accuracy"] for r in rows if r.get("eval/accuracy") is not None]
    trainer = [r["eval/accuracy_greedy_trainer"] for r in rows if r.get("eval/accuracy_greedy_trainer") is not None]
    finite = [r["grad_norm"] for r in rows if math.isfinite(r["grad_norm"])]
    ratio = [r["grpo/max_abs_log_ratio"] for r in rows if r.get("grpo/max_abs_log_ratio") is not None]
    gap = [r["eval/accuracy_greedy_trainer"] - r["eval/accuracy_greedy"] for r in rows
           if r.get("eval/accuracy_greedy_trainer") is not None and r.get("eval/accuracy_greedy") is not None]
    return dict(collapse_step=step, why=why, best_heldout=max(accs, default=None),
                final_heldout=accs[-1] if accs else None, heldout_area=_mean(accs),
                final_trainer_greedy=trainer[-1] if trainer else None, max_drawdown=max_drawdown(rows),
                max_grad_norm=max(finite, default=None), mean_kl=_mean([r.get("kl") for r in rows]),
                kl_trend=kl_trend(rows), median_max_log_ratio=statistics.median(ratio) if ratio else None,
                steps_log_ratio_over_10=sum(x > 10 for x in ratio) if ratio else None,
                served_gap=_mean(gap),  # the trainer's greedy accuracy minus the engine's, mean over evaluations
                mean_router_flips=_mean([r.get("router_flip_rate") for r in rows]),
                mean_token_flips=_mean([r.get("token_flip_rate") for r in rows]),
                first_reward=rows[0]["reward"] if rows else None, steps=len(rows),
                commit=commit[:10] if commit else None)


def cell_entry(runs: dict) -> dict:
    return dict(collapsed=sum(r["collapse_step"] is not None for r in runs.values()), n=len(runs), runs=runs)


def pairs(cells: list[str], paper: str) -> list[tuple[str, str]]:
    """TESTS_TEXT's comparisons among `cells` (first arm predicted to collapse more)."""
    out = []
    for c in cells:
        setting, arm, n = c.split("/")
        if arm == "none" and f"{setting}/r3/{n}" in cells:
            out.append((c, f"{setting}/r3/{n}"))
        if arm == "none" and f"{setting}/r2/{n}" in cells:
            out += [(c, f"{setting}/r2/{n}"), (f"{setting}/r2/{n}", f"{setting}/r3/{n}")]
    if "oracle/none/n4" in cells:
        out.append((f"{design.STRONGEST}/none/n4", "oracle/none/n4"))
    return out


def _paired(a: dict, b: dict, key: str) -> tuple[float | None, float, int, float | None, float | None]:
    """(mean of a - b, paired permutation p, pairs, 95 % t interval of the mean: lo, hi) over the seeds both cells
    finished (no interval below two pairs). Records keep 7 significant digits, so equal drawdowns can differ by ~1e-7:
    the test counts ties at experiments.stats.TOL."""
    diffs = [a[s][key] - b[s][key] for s in sorted(set(a) & set(b)) if a[s][key] is not None and b[s][key] is not None]
    lo = hi = None
    if len(diffs) >= 2:
        _, lo, hi = t_interval(diffs)
    return (statistics.fmean(diffs) if diffs else None), paired_permutation_test(diffs, tol=TOL), len(diffs), lo, hi


def compare(cells: dict, paper: str) -> list[dict]:
    res = []
    for a, b in pairs(list(cells), paper):
        ca, cb = cells[a], cells[b]
        if not ca["n"] or not cb["n"]:
            continue
        res.append(dict(a=a, b=b, metric="collapsed",
                        p=fisher_exact(ca["collapsed"], ca["n"], cb["collapsed"], cb["n"]),
                        effect=ca["collapsed"] / ca["n"] - cb["collapsed"] / cb["n"],
                        counts=f"{ca['collapsed']}/{ca['n']} vs {cb['collapsed']}/{cb['n']}"))
        for key in ("heldout_area", "max_drawdown"):
            effect, p, n, lo, hi = _paired(ca["runs"], cb["runs"], key)
            res.append(dict(a=a, b=b, metric=key, p=p, effect=effect, lo=lo, hi=hi, counts=f"{n} paired seeds"))
    return res


def answer(ts: list[dict], complete: bool) -> dict:
    """The reading at 4 mini-steps, per position (Holm over the five), and SELECTION_TEXT's pick."""
    by = {(t["a"], t["b"], t["metric"]): t for t in ts}  # keyed by both cells: none is also tested against r2, oracle
    rows = []
    for p in design.POSITIONS:
        c = by.get((f"{p}/none/n4", f"{p}/r3/n4", "collapsed"))
        area = by.get((f"{p}/none/n4", f"{p}/r3/n4", "heldout_area"))
        if c is not None:
            rows.append(dict(position=p, counts=c["counts"], p=c["p"], effect=c["effect"],
                             p_area=area["p"] if area else 1.0, area_effect=area["effect"] if area else None,
                             area_lo=area["lo"] if area else None, area_hi=area["hi"] if area else None))
    for key, adj in (("p", "p_holm"), ("p_area", "p_area_holm")):
        for r, q in zip(rows, holm([r[key] for r in rows])):
            r[adj] = q
    for r in rows:
        r["r3_holds"] = r["p_holm"] < 0.05 and r["effect"] > 0
    order = list(design.POSITIONS)
    pick = min(rows, key=lambda r: (r["p"], r["p_area"], order.index(r["position"]))) if rows else None
    return dict(positions=rows, pick=pick, separates=bool(complete and pick and pick["r3_holds"]),
                complete=complete)
