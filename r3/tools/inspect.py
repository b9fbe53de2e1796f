"""The mismatch inspector: per response token, where the engine and the trainer disagree, and which routers flipped.

  python -m r3.inspect ROLLOUT_DIR --preset toy --task sort     a rollout folder (rollout.py, `save_batch`), scored
                                                                now by the model rollout.py would load (same flags)
  python -m r3.inspect RUN_DIR [--step N]                       a run's sample dump, RUN/samples/stepN/ (the latest)

A sample dump (`dump_samples`, called by the trainer before its update) is a rollout folder plus `scores.safetensors`:
the per-token numbers below, computed at that step with the weights of that step, so no checkpoint is needed later.
Per response position p (scoring token p+1), all from `r3.train.score.score`, so that `r3.train.metrics.mismatch` of
them equals `r3.train.score.old_policy_pass`'s metrics on the same batch:
  logp_engine   the rollout engine's log-prob of the sampled token (`batch.rollout_logp`)
  logp_normal   the fp32 trainer's, router picks the experts (no replay);  log r = logp_normal − logp_engine
  logp_r3       the fp32 trainer's, replaying the recorded routes (R3)
  entropy       of the trainer's (no replay) next-token distribution
  flipped       [L] per MoE layer: the trainer's own top-k set differs from the recorded one
Output: a self-contained HTML page (tokens coloured by log r, flipped layers on hover and underneath, per-layer flip
histogram as inline SVG, summary table), a PNG (`r3.runs.plots.plot_inspection`) and a plain-text view on stdout.
Left out: JavaScript, multi-turn turn boundaries (every response token is shown as one response), and FSDP: the
dump runs one forward on one process, so under torchrun every rank must call it (rank 0 writes).
"""
import argparse
import glob
import html
import json
import math
import os
import re
import time

import torch
from safetensors.torch import load_file, save_file

from r3.rollout.batch import Batch, load_batch, save_batch
from r3.train.config import INT_GE0, THREADS, check_flags
from r3.errors import InputError, MissingInputError, run_main
from r3.runs.io import atomic_write, atomic_write_json
from r3.train.metrics import extreme_frac, kl_k3, masked_mean
from r3.runs.plots import log_r_rgb, plot_inspection
from r3.runs.provenance import markdown_line, provenance
from r3.train.score import score, token_logp

SCORES = "scores.safetensors"
LOG2 = math.log(2.0)


@torch.no_grad()
def token_scores(model, batch: Batch, *, temperature: float | None = None) -> dict:
    """The per-token numbers of the module docstring: each [B, T-1] (flipped [B, T-1, L] bool), 0 off the response.
    temperature defaults to the engine's (`batch.meta`), 1.0 for a greedy batch."""
    if temperature is None:
        temperature = float(batch.meta.get("temperature", 1.0)) or 1.0
    mask = batch.loss_mask
    normal = score(model, batch, replay=False, temperature=temperature)
    if normal.logp_V is not None:
        ent = -(normal.logp_V.exp() * normal.logp_V).sum(-1)
    else:
        ent = token_logp(model, batch.tokens, batch.attn_mask, None, temperature=temperature, chunk=1024,
                         with_entropy=True).entropy
    out = dict(logp_engine=torch.where(mask, batch.rollout_logp, 0.0), logp_normal=normal.logp,
               entropy=torch.where(mask, ent, 0.0))
    if batch.routes is not None:
        out["logp_r3"] = score(model, batch, replay=True, temperature=temperature).logp
        own, rec = normal.routes.long().sort(-1).values, batch.routes.long().sort(-1).values
        out["flipped"] = (own != rec).any(-1) & mask[..., None]
    return {k: v.detach().float() if k != "flipped" else v for k, v in out.items()}


def dump_samples(out_dir: str, batch: Batch, model, *, rows: int = 8, temperature: float | None = None) -> None:
    """Write the first `rows` rows of `batch` and their `token_scores` to `out_dir` (atomically): a sample dump.
    Call it with the weights that scored the batch, i.e. before the optimizer step (train.py: RUN/samples/stepN)."""
    sub = batch.select(slice(0, rows))
    sub.meta = dict(batch.meta)
    sc = token_scores(model, sub, temperature=temperature)

    def write(tmp):
        save_batch(sub, tmp)
        save_file({k: v.contiguous().to(torch.uint8) if k == "flipped" else v.contiguous() for k, v in sc.items()},
                  os.path.join(tmp, SCORES))
    atomic_write(out_dir, write)


def load_scores(folder: str) -> dict:
    sc = load_file(os.path.join(folder, SCORES))
    if "flipped" in sc:
        sc["flipped"] = sc["flipped"].bool()
    return sc


def summarize(batch: Batch, sc: dict) -> dict:
    """Aggregate numbers: kl, F(2), mean |log r| overall and on flipped / unflipped tokens, without and with R3."""
    mask = batch.loss_mask
    fl = sc.get("flipped")
    out = dict(rows=len(batch), tokens=int(mask.sum()), rollout_dtype=batch.meta.get("rollout_dtype"))
    if fl is not None:
        fl_BTL = fl.double()
        out.update(router_flip_rate=masked_mean(fl_BTL.mean(-1), mask),
                   token_flip_rate=masked_mean((fl_BTL.sum(-1) > 0).double(), mask),
                   flips_per_token=masked_mean(fl_BTL.sum(-1), mask),
                   layer_flip_rate=[masked_mean(fl_BTL[..., i], mask) for i in range(fl.shape[-1])])
    for arm in ("normal", "r3"):
        if f"logp_{arm}" not in sc:
            continue
        lt, le = sc[f"logp_{arm}"], sc["logp_engine"]
        a = dict(kl=kl_k3(lt, le, mask), extreme_frac=extreme_frac(lt, le, mask),
                 mean_abs_log_r=masked_mean((lt - le).abs().double(), mask),
                 max_abs_log_r=float(((lt - le).abs() * mask).max()) if mask.any() else float("nan"))
        if fl is not None:
            tok = fl.any(-1)
            for name, m in (("flipped", mask & tok), ("unflipped", mask & ~tok)):
                a[name] = dict(tokens=int(m.sum()), mean_abs_log_r=masked_mean((lt - le).abs().double(), m),
                               extreme_frac=extreme_frac(lt, le, m))
            big = mask & ((lt - le).abs() > LOG2)
            a["extreme_tokens"] = int(big.sum())
            a["extreme_flipped_share"] = masked_mean(tok.double(), big)
        out[arm] = a
    return out


def token_namer(vocab_size: int, tokenizer_path: str | None = None):
    """id → display string: the toy vocabulary, a checkpoint's tokenizer.json, else '#id'."""
    if tokenizer_path:
        from r3.scale.hf import load_tokenizer
        tok = load_tokenizer(tokenizer_path)
        return lambda i: tok.decode([i], skip_special_tokens=False)
    from r3.tasks.tasks import VOCAB
    if vocab_size <= len(VOCAB):
        return lambda i: VOCAB[i]
    return lambda i: f"#{i}"


def pick_rows(batch: Batch, sc: dict, n: int, order: str) -> list[int]:
    """The first n rows, or ('worst') the n whose largest |log r| (no replay) is largest, one per prompt group."""
    if order == "first":
        return list(range(min(n, len(batch))))
    worst = ((sc["logp_normal"] - sc["logp_engine"]).abs() * batch.loss_mask).amax(-1)
    out, groups = [], set()
    for r in worst.argsort(descending=True, stable=True).tolist():
        if int(batch.group[r]) not in groups and len(out) < n:
            out.append(r)
            groups.add(int(batch.group[r]))
    return out


def row_tokens(batch: Batch, sc: dict, r: int, name) -> tuple[list[str], list[dict]]:
    """(prompt token strings, one dict per response token: tok, pos, numbers, flipped layer ids)."""
    valid, mask = batch.attn_mask[r], batch.loss_mask[r]
    prompt = [name(int(batch.tokens[r, p])) for p in range(batch.tokens.shape[1])
              if valid[p] and not batch.response_mask[r, p]]
    out = []
    for p in mask.nonzero()[:, 0].tolist():
        d = dict(tok=name(int(batch.tokens[r, p + 1])), pos=p + 1, engine=float(sc["logp_engine"][r, p]),
                 normal=float(sc["logp_normal"][r, p]), entropy=float(sc["entropy"][r, p]))
        d["log_r"] = d["normal"] - d["engine"]
        if "logp_r3" in sc:
            d["r3"] = float(sc["logp_r3"][r, p])
            d["log_r_r3"] = d["r3"] - d["engine"]
            d["layers"] = sc["flipped"][r, p].nonzero()[:, 0].tolist()
        out.append(d)
    return prompt, out


def _fmt(x, spec=".3g"):
    return "-" if x is None or x != x else format(x, spec)  # x != x: NaN (no tokens of that kind)


def summary_rows(s: dict) -> list[tuple[str, str, str]]:
    """(quantity, no replay, R3) for the text and HTML tables."""
    n, r = s.get("normal", {}), s.get("r3", {})
    rows = [("kl (k3)", _fmt(n.get("kl")), _fmt(r.get("kl"))),
            ("F(2): fraction of tokens with |log r| > log 2", _fmt(n.get("extreme_frac"), ".4f"),
             _fmt(r.get("extreme_frac"), ".4f")),
            ("mean |log r|", _fmt(n.get("mean_abs_log_r")), _fmt(r.get("mean_abs_log_r"))),
            ("max |log r|", _fmt(n.get("max_abs_log_r")), _fmt(r.get("max_abs_log_r")))]
    if "router_flip_rate" in s:
        for k in ("flipped", "unflipped"):
            rows.append((f"mean |log r| on {k} tokens ({n[k]['tokens']})", _fmt(n[k]["mean_abs_log_r"]),
                         _fmt(r[k]["mean_abs_log_r"])))
            rows.append((f"F(2) on {k} tokens", _fmt(n[k]["extreme_frac"], ".4f"), _fmt(r[k]["extreme_frac"], ".4f")))
        rows.append(("share of |log r| > log 2 tokens that are flipped",
                     f"{_fmt(n['extreme_flipped_share'], '.3f')} of {n['extreme_tokens']}",
                     f"{_fmt(r['extreme_flipped_share'], '.3f')} of {r['extreme_tokens']}"))
        rows += [("router flip rate (token, layer)", _fmt(s["router_flip_rate"], ".4f"), ""),
                 ("token flip rate (≥ 1 layer)", _fmt(s["token_flip_rate"], ".4f"), ""),
                 ("flipped layers per token", _fmt(s["flips_per_token"], ".3f"), "")]
    return rows


def render_text(batch: Batch, sc: dict, s: dict, rows: list[int], name, title: str) -> str:
    lines = [title, f"{s['rows']} rows, {s['tokens']} response tokens; log r = log π_train − log π_engine "
                    f"(no replay / R3); '!' marks |log r| > log 2", ""]
    lines.append(f"{'':52s} {'no replay':>14s} {'R3':>14s}")
    lines += [f"{a:52s} {b:>14s} {c:>14s}" for a, b, c in summary_rows(s)]
    if "layer_flip_rate" in s:
        lines.append("flip rate per layer: " + "  ".join(f"L{i} {v:.2%}" for i, v in enumerate(s["layer_flip_rate"])))
    for r in rows:
        prompt, toks = row_tokens(batch, sc, r, name)
        lines += ["", f"row {r} (group {int(batch.group[r])}, reward {float(batch.rewards[r]):.3f}): "
                      f"{' '.join(prompt)} | {' '.join(t['tok'] for t in toks)}",
                  f"  {'pos':>4s} {'token':>10s} {'engine':>8s} {'trainer':>8s} {'R3':>8s} {'log r':>9s} "
                  f"{'log r R3':>9s} {'entropy':>7s}  flipped layers"]
        for t in toks:
            mark = "!" if abs(t["log_r"]) > LOG2 else " "
            lines.append(f"{mark} {t['pos']:4d} {t['tok'][:10]:>10s} {t['engine']:8.3f} {t['normal']:8.3f} "
                         f"{_fmt(t.get('r3'), '8.3f'):>8s} {t['log_r']:+9.2e} {_fmt(t.get('log_r_r3'), '+9.2e'):>9s} "
                         f"{t['entropy']:7.3f}  {','.join(map(str, t.get('layers', []))) or '-'}")
    return "\n".join(lines)


def log_r_colour(x: float) -> str:
    """CSS colour of a log-ratio (`r3.runs.plots.log_r_rgb`: white up to |x| = 1e-2, full at 1; red < 0, blue > 0)."""
    return "rgb({},{},{})".format(*(round(255 * c) for c in log_r_rgb(x)))


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;font-size:14px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child{text-align:left}.row{margin:1.2em 0;padding:.5em;border:1px solid #ddd;border-radius:4px}
.line{margin:.3em 0}.label{display:inline-block;width:6em;font-size:12px;color:#555}
.tok{display:inline-block;text-align:center;margin:1px;padding:1px 3px;border-radius:3px;vertical-align:top;
font-family:monospace;min-width:1.2em}.prompt{color:#888}h1{font-size:1.3em}
.fl{display:block;font-size:10px;color:#b00;background:#fff;margin:2px -3px -1px}
.flipped{outline:2px solid #b00}.scale span{padding:2px 6px;font-family:monospace;font-size:12px}"""


def _tok_html(t: dict, arm: str) -> str:
    lr = t["log_r"] if arm == "normal" else t["log_r_r3"]
    layers = t.get("layers", [])
    tip = (f"position {t['pos']} | engine logp {t['engine']:.4f} | trainer logp {t['normal']:.4f} | R3 logp "
           f"{_fmt(t.get('r3'), '.4f')} | log r {t['log_r']:+.3e} | log r R3 {_fmt(t.get('log_r_r3'), '+.3e')} | "
           f"entropy {t['entropy']:.3f} | flipped layers: {', '.join(map(str, layers)) or 'none'}")
    cls = "tok flipped" if layers and arm == "normal" else "tok"
    under = f"<span class=\"fl\">L{','.join(map(str, layers))}</span>" if layers and arm == "normal" else ""
    return (f"<span class=\"{cls}\" style=\"background:{log_r_colour(lr)}\" title=\"{html.escape(tip)}\">"
            f"{html.escape(t['tok'])}{under}</span>")


def _svg_bars(values: list[float], width: int = 480, height: int = 160) -> str:
    top = max(values + [1e-9])
    bw = width / max(1, len(values))
    parts = [f"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height + 30}\" "
             f"role=\"img\" aria-label=\"router flip rate per layer\">"]
    for i, v in enumerate(values):
        h = height * v / top
        parts.append(f"<rect x=\"{i * bw + 2:.1f}\" y=\"{height - h:.1f}\" width=\"{bw - 4:.1f}\" height=\"{h:.1f}\" "
                     f"fill=\"#c44\"><title>layer {i}: {v:.4%}</title></rect>"
                     f"<text x=\"{(i + .5) * bw:.1f}\" y=\"{height + 14}\" font-size=\"11\" text-anchor=\"middle\">"
                     f"L{i} {v:.2%}</text>")
    return "".join(parts) + "</svg>"


def render_html(batch: Batch, sc: dict, s: dict, rows: list[int], name, title: str) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{e(title)}</title><style>{CSS}</style>"
           f"</head><body><h1>{e(title)}</h1><p>{s['rows']} rows, {s['tokens']} response tokens, rollout "
           f"{e(str(s['rollout_dtype']))} vs the fp32 trainer. log r = log π_train − log π_engine of the sampled "
           f"token. Hover a token for its numbers; red outline and the numbers under a token: MoE layers whose "
           f"top-k set the trainer would change (no replay).</p>",
           "<h2>Summary</h2><table class=\"summary\"><tr><th></th><th>no replay</th><th>R3</th></tr>"]
    out += [f"<tr><td>{e(a)}</td><td>{e(b)}</td><td>{e(c)}</td></tr>" for a, b, c in summary_rows(s)]
    out.append("</table>")
    if "layer_flip_rate" in s:
        out.append(f"<h2>Router flips per layer</h2>{_svg_bars(s['layer_flip_rate'])}")
    scale = "".join(f"<span style=\"background:{log_r_colour(v)}\">{v:+g}</span>"
                    for v in (-1, -0.3, -0.1, -0.03, -0.01, 0.01, 0.03, 0.1, 0.3, 1))
    out.append(f"<h2>Samples</h2><p class=\"scale\">log r: {scale}</p>")
    for r in rows:
        prompt, toks = row_tokens(batch, sc, r, name)
        ptoks = "".join(f"<span class=\"tok prompt\">{e(t)}</span>" for t in prompt)
        out.append(f"<div class=\"row\" id=\"row-{r}\"><div>row {r}, group {int(batch.group[r])}, reward "
                   f"{float(batch.rewards[r]):.3f}</div>")
        for arm, label in (("normal", "no replay"), ("r3", "R3")):
            if arm == "r3" and "logp_r3" not in sc:
                continue
            out.append(f"<div class=\"line {arm}\"><span class=\"label\">{label}</span>{ptoks}"
                       + "".join(_tok_html(t, arm) for t in toks) + "</div>")
        out.append("</div>")
    return "\n".join(out) + "\n</body></html>\n"


def _no_nan(x):
    """NaN (a mean over no tokens) → None, so the JSON is strict."""
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_no_nan(v) for v in x]
    return None if isinstance(x, float) and x != x else x


def find_source(path: str, step: int | None = None) -> str:
    """A rollout or dump folder as given, or the dump of `step` (default: the latest) in a run folder."""
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    if not os.path.isdir(path):
        raise MissingInputError(f"{path} does not exist") if not os.path.exists(path) else \
            InputError(f"{path} is a file, not a rollout, dump or run folder")
    dumps = {int(m[1]): d for d in glob.glob(os.path.join(path, "samples", "step*"))
             if (m := re.fullmatch(r"step(\d+)", os.path.basename(d)))}
    if not dumps:
        raise InputError(f"{path}: neither a rollout folder (manifest.json) nor a run folder with sample dumps "
                         f"(samples/stepN/, written with train.py --dump-every)")
    if step is not None and step not in dumps:
        raise InputError(f"{path}: no dump of step {step}; dumped steps: {sorted(dumps)}")
    return dumps[max(dumps) if step is None else step]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("dir", help="rollout folder (rollout.py --out), sample dump folder, or run folder (its latest dump)")
    a("--step", type=int, default=None, help="run folder: the dump of this step instead of the latest")
    a("--out", default=None, help="output prefix for PREFIX.html and PREFIX.png (default: DIR/inspect)")
    a("--rows", type=int, default=6, help="rows shown in the HTML page and the text view")
    a("--png-rows", type=int, default=3, help="example rows drawn in the PNG")
    a("--order", choices=["worst", "first"], default="worst",
      help="which rows to show: the largest |log r| without replay first, or the batch order")
    a("--no-html", action="store_true", help="skip the HTML page")
    a("--no-png", action="store_true", help="skip the PNG")
    a("--tokenizer", default=None, help="checkpoint folder with tokenizer.json to show real tokens (default: the "
                                        "toy vocabulary, or the run's --model)")
    g = p.add_argument_group("model, for a rollout folder without stored scores (the same flags as rollout.py)")
    g.add_argument("--preset", default="toy", help="toy preset")
    g.add_argument("--model", default=None, help="a safetensors checkpoint instead (r3.runs.checkpoint.save_weights)")
    g.add_argument("--arch", default=None, help="preset for a checkpoint without a config in its metadata")
    g.add_argument("--task", default=None, help="toy task of the warm-up (default: the rollout's, else sort)")
    g.add_argument("--warmup-steps", type=int, default=80, help="supervised warm-up steps of the preset")
    g.add_argument("--init-seed", type=int, default=0, help="seed of the preset's init and warm-up")
    g.add_argument("--cache-dir", default=".cache/warmup", help="warm-up cache")
    g.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = p.parse_args(argv)
    check_flags(p, args, dict(step=INT_GE0, rows=INT_GE0, png_rows=INT_GE0, warmup_steps=INT_GE0, init_seed=INT_GE0,
                              threads=THREADS))
    return args


def load_source(args) -> tuple[Batch, dict, str, str | None]:
    """(batch, token scores, a title, tokenizer folder or None) for the CLI."""
    src = find_source(args.dir, args.step)
    batch = load_batch(src)
    run = os.path.dirname(os.path.dirname(os.path.abspath(src)))
    run_args = {}
    if os.path.exists(os.path.join(run, "args.json")):
        with open(os.path.join(run, "args.json")) as f:
            run_args = json.load(f)
    tok = args.tokenizer or run_args.get("model")
    if os.path.exists(os.path.join(src, SCORES)):
        return batch, load_scores(src), f"r3 inspect: {src}", tok
    from r3.tasks.tasks import make_task
    from r3.train.warmup import load_model
    spec = args.task or batch.meta.get("task") or "sort"
    model, desc = load_model(args.preset, path=args.model, dense=batch.routes is None, task=make_task(spec),
                             task_spec=spec,
                             warmup_steps=args.warmup_steps, init_seed=args.init_seed, cache_dir=args.cache_dir,
                             arch=args.arch, progress=False)
    if batch.meta.get("model") not in (None, desc):
        print(f"warning: the rollout was sampled by {batch.meta['model']!r}, but the trainer here is {desc!r}: "
              f"pass the rollout's --preset / --model / --task / --warmup-steps / --init-seed")
    return batch, token_scores(model, batch), f"r3 inspect: {src} (trainer: {desc})", tok


def main(argv=None) -> dict:
    t0 = time.time()
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    batch, sc, title, tok = load_source(args)
    name = token_namer(int(batch.tokens.max()) + 1, tok)
    s = summarize(batch, sc)
    rows = pick_rows(batch, sc, args.rows, args.order)
    print(render_text(batch, sc, s, rows, name, title))
    prefix = args.out or os.path.join(find_source(args.dir, args.step), "inspect")
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    if not args.no_png and "logp_r3" in sc:
        mask = batch.loss_mask
        plot_inspection(dict(abs_log_r={arm: (sc[f"logp_{arm}"] - sc["logp_engine"]).abs()[mask].tolist()
                                        for arm in ("normal", "r3")},
                             flips=sc["flipped"].sum(-1)[mask].tolist(), layer_flip_rate=s["layer_flip_rate"],
                             examples=[row_tokens(batch, sc, r, name) for r in rows[:args.png_rows]], summary=s),
                        prefix + ".png", title=title)
        print(f"wrote {prefix}.png")
    prov = provenance(None if argv is None else ["-m", "r3.inspect", *argv], t0)
    if not args.no_html:
        foot = f"<p><small>{html.escape(markdown_line(prov).replace('`', '').replace('**', ''))}</small></p></body>"
        with open(prefix + ".html", "w") as f:
            f.write(render_html(batch, sc, s, rows, name, title).replace("</body>", foot))
        print(f"wrote {prefix}.html")
    atomic_write_json(prefix + ".json", dict(_no_nan(s), provenance=prov))
    return s


if __name__ == "__main__":
    run_main(main)
