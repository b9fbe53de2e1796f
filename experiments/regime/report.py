"""The regime study's tables and figures: regime.{json,md,png} (the calibration) and grid.{json,md,png}."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.common import fmt, write_results
from experiments.regime import design
from experiments.regime.run_grid import walk_length

ROWS = (("router_flip_rate", "routers that differ", "router_flip_rate", "{:.1%}"),
        ("token_flip_rate", "tokens with >= 1 flip", "token_flip_rate", "{:.1%}"),
        ("flips_per_token", "flips per token", "flips_per_token", "{:.3g}"),
        ("abs_log_ratio_q50", "\\|log r\\| 50 %", None, "{:.3g}"),
        ("abs_log_ratio_q90", "\\|log r\\| 90 %", None, "{:.3g}"),
        ("abs_log_ratio_q99", "\\|log r\\| 99 %", None, "{:.3g}"),
        ("abs_log_ratio_q99.9", "\\|log r\\| 99.9 %", None, "{:.3g}"),
        ("extreme_frac", "F(2), no replay", None, "{:.2%}"), ("kl", "kl, no replay", "kl", "{:.2e}"),
        ("kl_r3", "kl, R3", "kl_r3", "{:.2e}"), ("response_length", "response length", None, "{:.1f}"),
        ("entropy", "entropy (nats / token)", None, "{:.2f}"), ("exposure", "S = length x kl", "exposure", "{:.3g}"),
        ("reward", "sampled reward", None, "{:.3f}"))


def ci(d: dict | None, spec: str) -> str:
    if not d or d.get("mean") is None:
        return "—"
    m = spec.format(d["mean"])
    return m if d.get("lo") is None else f"{m} [{spec.format(d['lo'])}, {spec.format(d['hi'])}]"


def paper_cell(key: str | None, spec: str) -> str:
    v = design.PAPER.get(key) if key else None
    if v is None:
        return "—"
    return f"{v[0]:g}-{v[1]:g}" if isinstance(v, tuple) else spec.format(v)


def regime_table(table: dict, when: str, names: list[str]) -> str:
    head = "| quantity | " + " | ".join(names) + " | paper (Qwen3-30B-A3B) |"
    lines = [head, "|---" * (len(names) + 2) + "|"]
    for key, label, pkey, spec in ROWS:
        cells = [ci(table[n].get(when, {}).get(key), spec) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {paper_cell(pkey, spec)} |")
    return "\n".join(lines)


def write_regime(out: str, data: dict, t0: float) -> None:
    names = list(data["table"])
    seeds = data["design"]["seeds"]
    pos = ", ".join(f"{n} ({'fp8-router itself' if b is None else f'--router-levels {b}'})"
                    for n, b in design.POSITIONS.items())
    parts = [f"# The regime table and calibration{'' if data['complete'] else ' (**partial**: some parts pending)'}",
             f"Settings: the dial positions {pos} on the fp8-router engine, and the fp32-engine oracle; cipher:32-32, "
             f"the toy. Each cell: mean and 95 % t interval over seeds {seeds} of one fixed probe batch "
             f"({design.MEASURE_PROMPTS} prompts x {design.MEASURE_SAMPLES} samples, seed {design.MEASURE_SEED}) "
             f"sampled by the setting's engine and scored by the fp32 trainer. The dial rows are an amplifier of the "
             f"engine's routing mismatch (the router weight rounded to an N-point grid), not a real engine; `natural` "
             f"and the oracle are the engines' own numerics.",
             "## At the start of RL (the start-matched warm-up)", regime_table(data["table"], "start", names)]
    if any("after" in v for v in data["table"].values()):
        parts += [f"## After {design.AFTER_STEPS} steps (the policy of each setting's none/n4 grid run at step "
                  f"{design.AFTER_STEPS})", regime_table(data["table"], "after", names)]
    parts += ["## Calibration", f"Rule (fixed before measuring): {data['design']['paper_text']}.",
              f"- paper-matched position (router flips closest to 10 %): **{data['paper_matched']}**\n"
              f"- position whose token flip rate is closest to 94 %: **{data['token_matched']}**\n"
              f"- strongest position: **{design.STRONGEST}**"]
    d = data["depth"]
    parts += ["## The deep preset's depth", f"Rule: {design.DEPTH_TEXT}.",
              "\n".join(["| layers | token flip rate (seeds 0, 1) |", "|---|---|"] +
                        [f"| {L} | {v:.1%} |" for L, v in d["measured"].items()] +
                        ([f"| {d['depth']} | not measured yet (the rule's fallback either way) |"]
                         if d["decided"] and d["depth"] not in d["measured"] else []))]
    parts.append(f"Outcome: **{d['depth']} layers**" if d["decided"] else "Outcome: pending")
    if data.get("timing"):
        t = data["timing"]
        parts.append(f"Step time (train.py, one thread): deep {t['step_time_s']['deep']:.2f} s, toy "
                     f"{t['step_time_s']['toy']:.2f} s, ratio {t['ratio']:.1f}x ({t['note']}).")
    if data.get("walk"):
        keys = ("token_flip_rate", "kl", "kl_r3", "response_length", "exposure", "entropy", "reward")
        reach = walk_length(data)
        parts += ["## The walk task (exposure)", "At the paper-matched position, seeds 0 and 1 (mean):",
                  "\n".join(["| T | tokens flipped | kl, no replay | kl, R3 | response length | S | entropy | "
                             "reward |", "|---" * 8 + "|"] +
                            [f"| {T} | " + " | ".join(fmt(w[k]["mean"]) for k in keys) + " |"
                             for T, w in data["walk"].items()]),
                  f"Walk length rule: the shortest T whose S reaches {design.PAPER['exposure'][0]}: " +
                  (f"**{reach}**" if reach is not None else "**none does; tier 3 is not run**")]
    if data.get("walk_demo"):
        rows, demo = [], data["walk_demo"]
        for task, runs in demo.items():
            for r in runs:
                rows.append(f"| {task} | {r['seed']} | {', '.join(f'{a:.2f}' for _, a in r['heldout'])} | "
                            f"{fmt(r['first_entropy'])} | {fmt(r['final_entropy'])} | {fmt(r['final_reward'])} |")
        walks = [t for t in demo if t.startswith("walk")]
        ent = {t: sum(r["final_entropy"] for r in runs) / len(runs) for t, runs in demo.items()}
        verdict = []
        for walk in walks:
            learned = [r["seed"] for r in demo[walk] if r["heldout"] and r["heldout"][-1][1] > 0]
            verdict.append(f"{walk} learns (held-out exact accuracy above 0 at the last evaluation): "
                           f"{'seeds ' + str(learned) if learned else '**no seed**'}.")
            verdict += [f"Its entropy over the last 50 steps: {fmt(ent[walk])} nats per token against {t}'s "
                        f"{fmt(ent[t])}: **{'above' if ent[walk] > ent[t] else 'not above'}** it."
                        for t in demo if not t.startswith("walk")]
        parts += ["Does the walk task learn and keep its entropy? The oracle engine, the grid's oracle/none/n4 flags "
                  "otherwise:", "\n".join(["| task | seed | held-out accuracy at each evaluation | entropy, step 0 | "
                                             "entropy, last 50 steps | reward, last step |", "|---" * 6 + "|"] + rows),
                  " ".join(verdict)]
    if data.get("pilot"):
        p = data["pilot"]
        parts += ["## Steps per run", f"Rule: {design.STEPS_TEXT}.",
                  "Pilot mean held-out accuracy by step: " +
                  ", ".join(f"{s}: {v:.3f}" for s, v in p["curve"].items()),
                  f"Plateau from step {p['plateau_step']}: **{p['steps']} steps** per grid run."]
    parts += ["## Start-matched seeds", "Sampled reward of the probe batch under the natural fp8-router engine, after "
              f"a fixed 80-step warm-up and after the start-matched one (--warmup-until {design.WARMUP_UNTIL}, at most "
              f"{design.WARMUP_CAP} steps):",
              "\n".join(["| seed | 80 steps | start-matched | its warm-up steps |", "|---|---|---|---|"] +
                        [f"| {r['seed']} | {r['fixed80']:.3f} | {r['matched']:.3f} | {r['warmup_steps']} |"
                         for r in data["starts"]])]
    os.makedirs(out, exist_ok=True)
    write_results(os.path.join(out, "regime.json"), data, md="\n\n".join(parts), t0=t0)
    plot_regime(data, os.path.join(out, "regime.png"))


def plot_regime(data: dict, path: str) -> None:
    names = list(design.POSITIONS)
    table = data["table"]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    xs = range(len(names))

    def line(ax, key, when, label, **kw):
        ys = [table[n].get(when, {}).get(key, {}).get("mean") for n in names]
        lo = [table[n].get(when, {}).get(key, {}).get("lo") for n in names]
        hi = [table[n].get(when, {}).get(key, {}).get("hi") for n in names]
        if all(y is not None for y in ys):
            ax.plot(xs, ys, marker="o", label=label, **kw)
            if all(v is not None for v in lo + hi):
                ax.fill_between(xs, lo, hi, alpha=0.15, color=kw.get("color"))
    for when, ls in (("start", "-"), ("after", "--")):
        line(axes[0], "router_flip_rate", when, f"routers, {when}", color="tab:blue", ls=ls)
        line(axes[0], "token_flip_rate", when, f"tokens, {when}", color="tab:orange", ls=ls)
        line(axes[1], "kl", when, f"no replay, {when}", color="tab:red", ls=ls)
        line(axes[1], "kl_r3", when, f"R3, {when}", color="tab:blue", ls=ls)
        line(axes[2], "exposure", when, f"S, {when}", color="tab:purple", ls=ls)
    axes[0].axhline(design.PAPER["router_flip_rate"], color="tab:blue", lw=0.8, ls=":", label="paper: routers")
    axes[0].axhline(design.PAPER["token_flip_rate"], color="tab:orange", lw=0.8, ls=":", label="paper: tokens")
    axes[1].axhline(design.PAPER["kl"], color="tab:red", lw=0.8, ls=":", label="paper: kl")
    axes[2].axhspan(*design.PAPER["exposure"], color="tab:purple", alpha=0.1, label="published collapses")
    for ax, title in zip(axes[:3], ("flip rates", "train-inference kl (k3)", "exposure S = length x kl")):
        ax.set_xticks(list(xs), names)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    for name, mark in ((data["paper_matched"], "paper-matched"), (data["token_matched"], "token-matched")):
        axes[0].annotate(mark, (names.index(name), table[name]["start"]["router_flip_rate"]["mean"]), fontsize=7,
                         xytext=(5, -12), textcoords="offset points")
    s = data["starts"]
    axes[3].plot([r["seed"] for r in s], [r["fixed80"] for r in s], "o", label="80-step warm-up")
    axes[3].plot([r["seed"] for r in s], [r["matched"] for r in s], "s", label="start-matched")
    axes[3].set_xlabel("seed")
    axes[3].set_title("sampled reward at the start of RL", fontsize=10)
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
