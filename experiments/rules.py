"""The collapse rules the studies read their runs by, a run's and a cell's summary by them, and the tables that show
them. Shared, so that no study imports another: the staleness grid made them, the length and regime studies use them
unchanged.

  RULE, sustained_collapse    the primary rule, fixed before the staleness grid ran: a fall that lasts (held-out
                              accuracy 0.3 below its best at two evaluations, or the reward EMA 0.3 below its peak
                              for 50 steps), or a non-finite loss or grad norm
  DIP_RULE, collapse_step     experiments.collapse's rule, fixed before its runs: any single dip; the grids' secondary
  max_drawdown                the largest fall of held-out accuracy below its best so far
  blocks                      k steps read as one (the staleness grid's n1fresh cells)
  run_summary, cell_summary   one run's row and one cell's entry of a grid.json
  cell_table, outcome_table, tests_table   the grids' markdown tables
"""
import math
import statistics

from experiments.common import fmt

DIP_RULE = dict(reward_ema_decay=0.9, reward_drop=0.3, peak_after_steps=5, heldout_drop=0.3, nonfinite=True)
DIP_RULE_TEXT = ("collapse = first step where reward EMA(0.9) <= running peak (after step 5) - 0.3, or held-out "
                 "accuracy <= its best so far - 0.3, or loss / grad norm non-finite")
RULE = dict(heldout_drop=0.3, heldout_consecutive=2, reward_ema_decay=0.9, reward_drop=0.3, reward_steps=50,
            peak_after_steps=5, nonfinite=True)
RULE_TEXT = ("sustained collapse = first step where held-out accuracy <= its best so far - 0.3 at two consecutive "
             "evaluations (or at the last one), or reward EMA(0.9) <= its running peak (after step 5) - 0.3 for 50 "
             "consecutive steps, or loss / grad norm non-finite; secondary: experiments.collapse's RULE (any dip)")


def collapse_step(rows: list[dict]) -> tuple[int | None, str | None]:
    """DIP_RULE applied to one run's metrics: (first collapsed step, why) or (None, None)."""
    ema, peak, best_acc = None, -math.inf, -math.inf
    for i, r in enumerate(rows):
        if DIP_RULE["nonfinite"] and not all(math.isfinite(r[k]) for k in ("loss", "grad_norm")):
            return r["step"], "nonfinite"
        decay = DIP_RULE["reward_ema_decay"]
        ema = r["reward"] if ema is None else decay * ema + (1 - decay) * r["reward"]
        if i >= DIP_RULE["peak_after_steps"]:
            peak = max(peak, ema)
            if ema <= peak - DIP_RULE["reward_drop"]:
                return r["step"], "reward_drop"
        acc = r.get("eval/accuracy")
        if acc is not None:
            best_acc = max(best_acc, acc)
            if acc <= best_acc - DIP_RULE["heldout_drop"]:
                return r["step"], "heldout_drop"
    return None, None


def blocks(rows: list[dict], k: int) -> list[dict]:
    """k consecutive steps as one (n1fresh: the samples of one N = 4 step): mean reward, the last held-out
    evaluation, the largest grad norm (a non-finite one if any), the sum of losses; step = the block's index. A
    run that stopped early keeps its last, shorter block, so the step that stopped it is still read."""
    if k == 1:
        return rows
    out = []
    for i in range(0, len(rows), k):
        b = rows[i:i + k]
        evals = [r for r in b if r.get("eval/accuracy") is not None]
        norms = [r["grad_norm"] for r in b]
        out.append(dict(step=i // k, reward=sum(r["reward"] for r in b) / len(b), loss=sum(r["loss"] for r in b),
                        grad_norm=next((g for g in norms if not math.isfinite(g)), max(norms)),
                        kl=_mean([r.get("kl") for r in b]),
                        **({"eval/accuracy": evals[-1]["eval/accuracy"]} if evals else {})))
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None and x == x]
    return sum(xs) / len(xs) if xs else None


def sustained_collapse(rows: list[dict], acc: str = "eval/accuracy",
                       relative: float | None = None, floor: float = 0.1) -> tuple[int | None, str | None]:
    """RULE (primary) on one run's metrics rows: (first collapsed step, why) or (None, None). Each criterion gives
    its first step; the earliest wins. `acc`: the held-out metric (experiments/length/: eval/reward).
    `relative` (experiments/length/'s secondary rule): a fall to at most (1 - relative) x the best held-out value
    or the peak reward EMA, counted only once that best or peak is at least `floor`, instead of 0.3 below it."""
    found = []
    bad = [r["step"] for r in rows if not all(math.isfinite(r[k]) for k in ("loss", "grad_norm"))]
    if RULE["nonfinite"] and bad:
        found.append((bad[0], "nonfinite"))

    def fell(value: float, top: float, drop: float) -> bool:
        if relative is None:
            return value <= top - drop
        return top >= floor and value <= (1 - relative) * top

    ema, peak, low_since = None, -math.inf, None
    for i, r in enumerate(rows):
        d = RULE["reward_ema_decay"]
        ema = r["reward"] if ema is None else d * ema + (1 - d) * r["reward"]
        if i < RULE["peak_after_steps"]:
            continue
        peak = max(peak, ema)
        low_since = (r["step"] if low_since is None else low_since) if fell(ema, peak, RULE["reward_drop"]) else None
        if low_since is not None and r["step"] - low_since + 1 >= RULE["reward_steps"]:
            found.append((low_since, "reward_drop"))
            break
    evals = [(r["step"], r[acc]) for r in rows if r.get(acc) is not None]
    best, streak = -math.inf, []
    for j, (step, a) in enumerate(evals):
        best = max(best, a)
        streak = streak + [step] if fell(a, best, RULE["heldout_drop"]) else []
        if len(streak) >= RULE["heldout_consecutive"] or (streak and j == len(evals) - 1):
            found.append((streak[0], "heldout_drop"))
            break
    return min(found) if found else (None, None)


def max_drawdown(rows: list[dict], acc: str = "eval/accuracy") -> float | None:
    accs = [r[acc] for r in rows if r.get(acc) is not None]
    best, dd = -math.inf, 0.0
    for a in accs:
        best = max(best, a)
        dd = max(dd, best - a)
    return dd if accs else None


def run_summary(commit: str | None, rows: list[dict], k: int = 1, acc: str = "eval/accuracy") -> dict:
    """One run's row of the tables, from its metrics rows (k: the block size, n1fresh 4) and the commit it ran at."""
    b = blocks(rows, k)
    step, why = sustained_collapse(b, acc)
    step2, why2 = collapse_step(b) if acc == "eval/accuracy" else (None, None)
    accs = [r[acc] for r in b if r.get(acc) is not None]
    finite = [r["grad_norm"] for r in rows if math.isfinite(r["grad_norm"])]
    return dict(collapse_step=step, why=why, secondary_step=step2, secondary_why=why2,
                max_drawdown=max_drawdown(b, acc),
                best_heldout=max(accs, default=None), final_heldout=accs[-1] if accs else None,
                max_grad_norm=max(finite, default=None), mean_kl=_mean([r.get("kl") for r in rows]),
                mean_staleness_flips=_mean([r.get("staleness/router_flip_rate") for r in rows]),
                mean_engine_flips=_mean([r.get("router_flip_rate") for r in rows]),
                max_abs_log_ratio=max((r["grpo/max_abs_log_ratio"] for r in rows if "grpo/max_abs_log_ratio" in r),
                                      default=None), steps=len(b), commit=commit[:10] if commit else None,
                first_reward=rows[0].get("reward") if rows else None)


def cell_summary(runs: dict, alias_of: str | None = None) -> dict:
    """A cell's entry in grid.json from its per-seed run summaries: the collapse counts, and the runs."""
    return dict(collapsed=sum(r["collapse_step"] is not None for r in runs.values()), n=len(runs),
                secondary_collapsed=sum(r["secondary_step"] is not None for r in runs.values()), alias_of=alias_of,
                runs=runs)


def cell_table(cells: dict, names: list[str], secondary: str = "any dip") -> str:
    lines = [f"| cell | collapsed (sustained) | collapsed ({secondary}) | max drawdown: median [min, max] | "
             "best / final held-out (mean) | median max grad norm | mean kl | staleness flips | engine flips |",
             "|---" * 9 + "|"]
    for c in names:
        d = cells[c]
        rs = list(d["runs"].values())
        dd = sorted(r["max_drawdown"] for r in rs if r["max_drawdown"] is not None)
        gn = sorted(r["max_grad_norm"] for r in rs if r["max_grad_norm"] is not None)
        steps = [r["collapse_step"] for r in rs if r["collapse_step"] is not None]
        name = c + (f" (= {d['alias_of']}: R2 is the identity at one mini-step)" if d["alias_of"] else "")
        lines.append(f"| {name} | {d['collapsed']} of {d['n']}{' @ ' + str(sorted(steps)) if steps else ''} | "
                     f"{d['secondary_collapsed']} of {d['n']} | "
                     f"{fmt(statistics.median(dd) if dd else None)} [{fmt(dd[0] if dd else None)}, "
                     f"{fmt(dd[-1] if dd else None)}] | {fmt(_mean([r['best_heldout'] for r in rs]))} / "
                     f"{fmt(_mean([r['final_heldout'] for r in rs]))} | {fmt(statistics.median(gn) if gn else None)} | "
                     f"{fmt(_mean([r['mean_kl'] for r in rs]))} | {fmt(_mean([r['mean_staleness_flips'] for r in rs]))}"
                     f" | {fmt(_mean([r['mean_engine_flips'] for r in rs]))} |")
    return "\n".join(lines)


def outcome_table(cells: dict, names: list[str], seeds, secondary: str = "any dip", note: str = "") -> str:
    """One row per cell, one column per seed: how each run ended, so a partial grid reads at a glance."""
    def entry(r: dict | None) -> str:
        if r is None:
            return "·"
        how = (f"**fell {r['collapse_step']}**" if r["collapse_step"] is not None else
               f"dip {r['secondary_step']}" if r["secondary_step"] is not None else "ok")
        return f"{how} ({fmt(r['best_heldout'])})"
    lines = [f"`fell S`: a sustained collapse (the primary rule) first at step S; `dip S`: the secondary rule "
             f"({secondary}) only, first at step S; `ok`: neither; in brackets the run's best held-out; `·`: not "
             f"finished yet{note}.", "",
             "| cell | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---" * (len(seeds) + 1) + "|"]
    for c in names:
        runs = cells[c]["runs"]
        lines.append(f"| {c} | " + " | ".join(entry(runs.get(str(s), runs.get(s))) for s in seeds) + " |")
    return "\n".join(lines)


def tests_table(ts: list[dict]) -> str:
    lines = ["| a | b | metric | a vs b | effect (a - b) | p |", "|---|---|---|---|---|---|"]
    lines += [f"| {t['a']} | {t['b']} | {t['metric']} | {t['counts']} | {fmt(t['effect'])} | {t['p']:.3g} |"
              for t in ts]
    return "\n".join(lines)
