"""The levers' rows as tables, and the two grid rules that read them: OUT/rows.{json,md}
(`python -m experiments.regime --levers --report`).

  rows_data(out, seeds)     every row summarised from the measurements made so far (mean and 95 % t interval over
                            seeds), each marked complete, partial (n of 8) or pending, the dial's natural and lv3
                            rows and the paper's figures beside them (results/regime/regime.json, design.PAPER)
  lag_choice(lag, target)   LAG_RULE_TEXT: K* from the lag rows' token flip rates and lv3's (None while undecided)
  int4_preset(start, after) FALLBACK_TEXT: qwen3-ratio or the toy (None while undecided)
"""
import json
import os

from experiments.common import fmt, write_results
from experiments.regime import design, levers, plots
from experiments.regime.calibrate import calibrate_root, interval, made, summarise
from experiments.regime.confirm_report import design_commit
from experiments.regime.report import ci, paper_cell, regime_table

LAG_ROWS = (("router_flip_rate", "routers that differ", "router_flip_rate", "{:.1%}"),
            ("token_flip_rate", "tokens with >= 1 flip", "token_flip_rate", "{:.1%}"),
            ("flips_per_token", "flips per token", "flips_per_token", "{:.3g}"),
            ("kl", "kl, no replay", "kl", "{:.2e}"), ("response_length", "response length", None, "{:.1f}"),
            ("exposure", "S = length x kl", "exposure", "{:.3g}"), ("reward", "sampled reward", None, "{:.3f}"),
            ("probe_kl", "probe at step 200: kl, no replay", "kl", "{:.2e}"),
            ("probe_kl_r3", "probe at step 200: kl, R3", "kl_r3", "{:.2e}"),
            ("probe_token_flip_rate", "probe at step 200: tokens flipped", "token_flip_rate", "{:.1%}"))
LAG_COLUMNS = ("lag0", *levers.LAG_ROWS, "lv3")


def status(n: int, of: int) -> str:
    return "complete" if n >= of else ("pending" if n == 0 else f"partial: {n} of {of}")


def label(name: str, n: int, of: int) -> str:
    s = status(n, of)
    return name if s == "complete" else f"{name} ({s})"


def lag_choice(lag: dict, target: float | None, seeds: int = len(design.SEEDS)) -> int | None:
    """K* of LAG_RULE_TEXT from {lagK: {token_flip_rate: {mean, n}}} and lv3's mean; None until every lag row has
    `seeds` seeds and the target is known."""
    rows = {k: lag.get(f"lag{k}", {}).get("token_flip_rate", {}) for k in levers.LAGS}
    if target is None or any(r.get("n", 0) < seeds or r.get("mean") is None for r in rows.values()):
        return None
    return min(levers.LAGS, key=lambda k: (abs(rows[k]["mean"] - target), k))


def int4_preset(warmups: list[dict | None], start: dict | None, after: dict | None,
                seeds: int = len(design.SEEDS)) -> tuple[str | None, str]:
    """FALLBACK_TEXT: (preset, why) from qwen3-ratio-int4's warm-up infos and its start / after rewards ({mean, n});
    (None, why) until decided."""
    if len(warmups) < seeds or None in warmups:
        return None, f"qwen3-ratio's warm-ups: {sum(w is not None for w in warmups)} of {seeds} measured"
    missed = [i for i, w in enumerate(warmups) if not w.get("reached")]
    if missed:
        return "toy", f"qwen3-ratio's start-matched warm-up missed the target on {len(missed)} of {seeds} seeds"
    if not start or not after or start.get("n", 0) < seeds or after.get("n", 0) < seeds:
        return None, "qwen3-ratio-int4's start and after-200 rewards are not complete"
    gain = after["mean"] - start["mean"]
    if gain < levers.FALLBACK_MARGIN:
        return "toy", f"qwen3-ratio-int4's sampled reward rose {gain:+.3f} in 200 steps (< {levers.FALLBACK_MARGIN})"
    return "qwen3-ratio", f"reached on all {seeds} seeds; sampled reward {start['mean']:.3f} -> {after['mean']:.3f}"


def lag_summary(res: dict, name: str, seeds) -> dict:
    rs = [res[f"lag-{name}-s{s}"] for s in seeds if f"lag-{name}-s{s}" in res]
    out = {k: interval([r.get(k) for r in rs]) for k, *_ in LAG_ROWS}
    out["collapsed"] = dict(n=len(rs), falls=sum(r.get("collapse_step") is not None for r in rs))
    return out


def rows_data(out: str, seeds, regime_json: str | None = None, measured: str | None = None) -> dict:
    """`measured`: the folder whose measure/ holds the measurements (default `out`)."""
    regime_json = regime_json or os.path.join(calibrate_root(), "results", "regime", "regime.json")
    src = measured or out
    res = {**made(src, "start"), **made(src, "after"), **made(src, "lag")}
    of = len(seeds)
    count = lambda kind, name: sum(f"{kind}-{name}-s{s}" in res for s in seeds)  # noqa: E731
    lowbit = {r: dict(start=summarise(res, "start", r, seeds), after=summarise(res, "after", r, seeds),
                      n=dict(start=count("start", r), after=count("after", r)),
                      warmups=[res.get(f"start-{r}-s{s}", {}).get("warmup") for s in seeds])
              for r in levers.LOWBIT_ROWS}
    lag = {r: dict(lag_summary(res, r, seeds), n=count("lag", r)) for r in LAG_COLUMNS}
    dial, dial_line = {}, {}
    if os.path.exists(regime_json):
        with open(regime_json) as f:
            table = json.load(f)["table"]
        dial = {n: table[n] for n in ("natural", design.STRONGEST)}
        dial_line = {n: {k: table[n]["start"][k]["mean"] for k in ("token_flip_rate", "kl", "kl_r3")}
                     for n in design.POSITIONS if n in table}
    k_star = lag_choice(lag, lag["lv3"]["token_flip_rate"]["mean"] if lag["lv3"]["n"] == of else None, of)
    q = lowbit["qwen3-ratio-int4"]
    preset, why = int4_preset(q["warmups"], q["start"]["reward"], q["after"]["reward"], of)
    complete = all(v["n"]["start"] == of and v["n"]["after"] == of for v in lowbit.values()) and \
        all(v["n"] == of for v in lag.values())
    made_at = sorted({v["provenance"]["commit"][:10] for v in res.values() if v.get("provenance", {}).get("commit")})
    return dict(seeds=list(seeds), design_commit=design_commit("levers.py"), made_at=made_at,
                lowbit=lowbit, lag=lag, dial=dial, dial_line=dial_line, paper=design.PAPER, k_star=k_star,
                int4_preset=preset, int4_why=why, complete=complete,
                design=dict(lowbit=levers.LOWBIT_TEXT, lag=levers.LAG_TEXT, lag_kl_r3=levers.LAG_KL_R3_TEXT,
                            lag_rule=levers.LAG_RULE_TEXT, fallback=levers.FALLBACK_TEXT))


def lowbit_table(data: dict, when: str) -> str:
    of, table = len(data["seeds"]), {}
    for n, d in data["dial"].items():
        if when in d:
            table[f"dial: {n}"] = {when: d[when]}
    for r, v in data["lowbit"].items():
        table[label(r, v["n"][when], of)] = {when: v[when]}
    return regime_table(table, when, list(table))


def lag_table(data: dict) -> str:
    of, cols = len(data["seeds"]), data["lag"]
    names = {"lag0": "K = 0 (natural)", "lv3": "lv3, K = 0 (target)", **{f"lag{k}": f"K = {k}" for k in levers.LAGS}}
    heads = [label(names[c], cols[c]["n"], of) for c in LAG_COLUMNS]
    lines = ["| quantity | " + " | ".join(heads) + " | paper (Qwen3-30B-A3B) |", "|---" * (len(heads) + 2) + "|"]
    for key, text, pkey, spec in LAG_ROWS:
        lines.append(f"| {text} | " + " | ".join(ci(cols[c][key], spec) for c in LAG_COLUMNS) +
                     f" | {paper_cell(pkey, spec)} |")
    lines.append("| runs fallen by step 200 | " + " | ".join(
        f"{cols[c]['collapsed']['falls']} of {cols[c]['collapsed']['n']}" for c in LAG_COLUMNS) + " | — |")
    return "\n".join(lines)


def warmup_lines(data: dict) -> list[str]:
    out = []
    for preset in levers.LOWBIT_PRESETS:
        ws = data["lowbit"][f"{preset}-{levers.LOWBIT_DTYPES[0]}"]["warmups"]
        cells = ["pending" if w is None else f"{'reached' if w.get('reached') else 'missed'} at {w.get('steps')} "
                 f"({fmt(w.get('probe_reward'))})" for w in ws]
        out.append(f"| {preset} | " + " | ".join(cells) + " |")
    return ["| preset | " + " | ".join(f"seed {s}" for s in data["seeds"]) + " |",
            "|---" * (len(data["seeds"]) + 1) + "|", *out]


def write_rows(out: str, data: dict, t0: float | None = None) -> None:
    state = "" if data["complete"] else " (**partial**: measurements pending)"
    k = data["k_star"]
    parts = [f"# The levers in the regime table{state}",
             f"Seeds {data['seeds']} (the regime table's: these rows sit beside its rows; no test reads them). "
             "Each cell: mean [95 % t interval over seeds]; a column marked partial or pending lacks seeds. The dial's "
             "rows are results/regime/regime.json's, the paper's figures design.PAPER's.",
             f"Design and rules (fixed before any measurement, experiments/regime/levers.py, added at commit "
             f"{(data['design_commit'] or 'unknown (no git)')[:10]}; the measurements here ran at "
             f"{', '.join(data['made_at']) or '—'}).",
             "## Low-bit engines at the start of RL", levers.LOWBIT_TEXT + ".", lowbit_table(data, "start"),
             f"## Low-bit engines after {design.AFTER_STEPS} steps", lowbit_table(data, "after"),
             "### Start-matched warm-ups (sampled probe reward 0.3 within 400 steps; the warm-up does not depend on "
             "the engine)", "\n".join(warmup_lines(data)),
             "## Rollout lag over training (the natural fp8-router engine, the toy)", levers.LAG_TEXT + ".",
             levers.LAG_KL_R3_TEXT + ".", lag_table(data),
             "## The grid's rules", f"Lag rule: {levers.LAG_RULE_TEXT}. Outcome: " +
             ("pending" if k is None else f"**K* = {k}**"),
             f"Fallback rule: {levers.FALLBACK_TEXT}. Outcome: " +
             ("pending" if data["int4_preset"] is None else f"**{data['int4_preset']}**") + f" ({data['int4_why']})."]
    parts.insert(3, "![the levers in the regime table](rows.png)")
    write_results(os.path.join(out, "rows.json"), data, md="\n\n".join(parts), t0=t0)
    plots.levers_figure(data, os.path.join(out, "rows.png"))

