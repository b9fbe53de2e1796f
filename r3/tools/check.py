"""Is my R3 wiring right? Compare recorded routes with the experts the trainer's own router picks on the same tokens.

    python -m r3.check --rollouts DIR --preset toy        (the toy: same --task / --warmup-steps / --init-seed as
    python -m r3.check --rollouts DIR --model PATH         rollout.py; PATH: an HF Qwen3-MoE folder or r3 checkpoint)

Per MoE layer, over the positions an engine fed (a real token followed by a real token): the overlap of the recorded
top-k set with the trainer's own, |recorded ∩ own| / K, and the flip rate (sets differ); then the kl of the trainer
against the engine's log-probs without and with replay (`r3.train.score.old_policy_pass`, `r3.train.score.score`). A
healthy run: overlap far above chance (K / E), a flip rate of a few to ~10 % for a bf16 engine (arXiv 2510.11370
measures 10 % on Qwen3-30B-A3B), and a lower kl with replay. Detectors for what the field's bug reports show goes wrong,
each with what it likely means:
  layer shift      recorded layer l agrees better with trained layer l +- 1 than with l
  position shift   recorded position p agrees better with trained position p +- 1
  another model    overlap near chance
  zero padding     rows whose K ids are not distinct (K zeros: padding written as 0)
  empty layer      a layer whose fed rows are all zero
  bad ids          ids outside [0, E), e.g. -1 for "no routed experts"
Rollout folders are read with `r3.rollout.batch.load_batch`; a folder it refuses for its routes (duplicates, ids out of
range, in an int32 / uint8 file) is read raw so that the checker can report it. `check_alignment(model, batches)` is
the library form (any `Batch`es, e.g. built by your own converter); `render` prints a report.
Left out: other stacks' dump formats (convert with r3.rollout.engine_formats.sglang_sample / vllm_sample +
batch_from_samples), per-token drill-down, models with dense layers (the loader refuses them).
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file

from r3.rollout.batch import Batch, TENSORS, load_batch, rollout_folders
from r3.train.config import INT_GE0, THREADS, RolloutConfig, check_flags
from r3.errors import InputError, run_main
from r3.model.moe import RoutesError
from r3.train.metrics import kl_k3
from r3.train.score import old_policy_pass, score

MARGIN = 0.1  # a shifted alignment must beat the aligned one by this much overlap to be flagged
MEANS = {
    "layer shift": "the engine and the trainer number MoE layers differently: one counts a dense layer "
                   "(first_k_dense_replace / mlp_only_layers) or an MTP layer the other does not, or an off-by-one "
                   "in the layer index of the capture",
    "position shift": "routes are misaligned with tokens: an engine's [T-1] rows padded at the wrong end, the last "
                      "token given a route, prompt and response routes concatenated with a gap or an overlap "
                      "(routed_experts_start_len), or left padding applied to routes twice",
    "another model": "the routes do not come from this model's routers: another checkpoint, weights not synced to "
                     "the engine, or another expert numbering (expert-parallel permutation not undone)",
    "low agreement": "more flips than precision alone explains: stale engine weights (sync lag), a different "
                     "router precision or a quantised router, or routes of an older policy",
    "zero padding": "positions without a route were filled with zeros (K equal ids is not a top-k set); replay "
                    "would route those tokens to expert 0 K times. Fill them with distinct ids, or mask them",
    "empty layer": "the engine wrote nothing for this layer: its capture is off, or it is a dense layer that the "
                   "engine counts as MoE",
    "bad ids": "ids outside [0, E): -1 marks 'no routed experts' in some engines (sglang-jax), or the ids are "
               "global over expert-parallel ranks / another model's expert count",
    "replay does not help": "replaying these routes does not bring the trainer closer to the engine: they are "
                            "misaligned, or the mismatch is not from routing",
}


def load_raw(folder: str) -> Batch:
    """`load_batch`, or when it refuses the routes of an int32 / uint8 file: the same batch with the ids unchecked."""
    try:
        return load_batch(folder)
    except RoutesError:
        with open(os.path.join(folder, "manifest.json")) as f:
            manifest = json.load(f)
        if manifest.get("routes_codec") not in ("int32", "uint8"):
            raise
        t = load_file(os.path.join(folder, "batch.safetensors"))
        data = t["routes"].view(torch.int32) if manifest["routes_codec"] == "int32" else t["routes"]
        routes = data.long().view(manifest["routes_shape"])
        return Batch(routes=routes, meta=manifest.get("meta", {}), **{k: t[k] for k in TENSORS})


def find_batches(path: str) -> list[Batch]:
    """Every batch folder of `path` (`r3.rollout.batch.rollout_folders`: a gap in the steps is refused), read raw."""
    out = []
    for d in rollout_folders(path):
        b = load_raw(d)
        b.meta["source"] = d
        out.append(b)
    return out


def _onehot(ids: torch.Tensor, E: int) -> torch.Tensor:
    """[..., K] ids -> [..., E] 0/1 (out-of-range ids dropped; duplicates count once)."""
    ok = (ids >= 0) & (ids < E)
    return torch.zeros(*ids.shape[:-1], E).scatter_(-1, ids.clamp(0, E - 1), ok.float()).clamp_(max=1.0)


def _overlaps(rec_oh, own_oh, fed, K):
    """Sums over fed positions: aligned per layer, layers +-1, positions +-1 (value sum, count)."""
    ov = lambda a, b: (a * b).sum(-1) / K  # noqa: E731
    aligned = ov(rec_oh, own_oh)  # [B, T, L]
    both = fed[:, :-1] & fed[:, 1:]
    out = dict(aligned=(aligned[fed].sum(0), fed.sum()))
    for name, a, b, m in (("layer+1", rec_oh[..., :-1, :], own_oh[..., 1:, :], fed),
                          ("layer-1", rec_oh[..., 1:, :], own_oh[..., :-1, :], fed),
                          ("position+1", rec_oh[:, :-1], own_oh[:, 1:], both),
                          ("position-1", rec_oh[:, 1:], own_oh[:, :-1], both)):
        out[name] = (ov(a, b)[m].sum(), m.sum() * a.shape[-2])
    return out


@torch.no_grad()
def check_alignment(model, batches: list[Batch]) -> dict:
    """Per-layer agreement of recorded routes with `model`'s own top-k, kl with / without replay, and findings."""
    cfg = model.cfg
    if cfg.dense:
        raise InputError("the model is dense: it has no routers to check routes against")
    L, K, E = cfg.num_hidden_layers, cfg.num_experts_per_tok, cfg.num_experts
    ov, flips, n = torch.zeros(L, dtype=torch.float64), torch.zeros(L, dtype=torch.float64), 0
    shifts, dups, zeros, bad, kls = {}, torch.zeros(L, dtype=torch.long), torch.zeros(L, dtype=torch.long), 0, []
    for b in batches:
        if b.routes is None or tuple(b.routes.shape[2:]) != (L, K) or b.routes.shape[:2] != b.tokens[:, 1:].shape:
            shape = None if b.routes is None else list(b.routes.shape)
            raise RoutesError(f"{b.meta.get('source', 'batch')}: routes {shape} do not fit tokens "
                              f"{list(b.tokens.shape)} on a model with {L} layers and top-{K}")
        rec = b.routes.long()
        fed = b.attn_mask[:, :-1] & b.attn_mask[:, 1:]
        _, own = model(b.tokens[:, :-1], valid_BT=b.attn_mask[:, :-1])
        rec_oh, own_oh = _onehot(rec, E), _onehot(own.long(), E)
        for k, (s, c) in _overlaps(rec_oh, own_oh, fed, K).items():
            s0, c0 = shifts.get(k, (0.0, 0))
            shifts[k] = (s0 + s, c0 + c)
        srt = rec.sort(-1).values
        dup_BTL = (srt[..., 1:] == srt[..., :-1]).any(-1) & fed[..., None]
        bad_BTL = ((rec < 0) | (rec >= E)).any(-1) & fed[..., None]
        replay = torch.where(fed[..., None, None], rec, torch.arange(K))  # rows never fed: distinct dummy ids
        ov += ((rec_oh * own_oh).sum(-1) / K)[fed].sum(0).double()
        flips += (rec_oh != own_oh).any(-1)[fed].sum(0).double()
        dups += dup_BTL.sum((0, 1))
        zeros += ((rec == 0).all(-1) & fed[..., None]).sum((0, 1))
        bad += int(bad_BTL.sum())
        n += int(fed.sum())
        ok = not dup_BTL.any() and not bad_BTL.any()  # else replay cannot run: kl with replay is n/a
        temperature = float(b.meta.get("temperature", 1.0))
        with torch.no_grad():
            kl_replay = kl_k3(score(model, b, replay=replay, temperature=temperature).logp, b.rollout_logp,
                              b.loss_mask) if ok else None
        kls.append((old_policy_pass(model, b, temperature=temperature).metrics["kl"], kl_replay,
                    int(b.loss_mask.sum())))
    report = dict(batches=len(batches), fed_positions=n, num_layers=L, top_k=K, num_experts=E, chance_overlap=K / E,
                  overlap=float(ov.sum() / max(n * L, 1)), flip_rate=float(flips.sum() / max(n * L, 1)),
                  layers=[dict(layer=i, overlap=float(ov[i] / max(n, 1)), flip_rate=float(flips[i] / max(n, 1)),
                               dup_rows=int(dups[i]), zero_rows=int(zeros[i])) for i in range(L)],
                  shifts={k: float(s / c) if c else None for k, (s, c) in shifts.items() if k != "aligned"},
                  kl=_kl_summary(kls), bad_ids=bad)
    report["findings"] = findings(report)
    report["ok"] = not any(f["severity"] == "error" for f in report["findings"])
    return report


def _kl_summary(kls) -> dict:
    """Token-weighted means of (kl without replay, kl with replay or None, tokens) per batch; None if any is None."""
    w = sum(t for _, _, t in kls)

    def mean(i):
        if any(k[i] is None for k in kls):
            return None
        return sum(k[i] * k[2] for k in kls) / max(w, 1)
    return dict(no_replay=mean(0), replay=mean(1), tokens=w)


def findings(r: dict) -> list[dict]:
    out = []

    def add(name, severity, detail):
        out.append(dict(name=name, severity=severity, detail=detail, means=MEANS[name]))
    aligned, chance, sh = r["overlap"], r["chance_overlap"], r["shifts"]
    shifted = False
    for kind in ("layer", "position"):
        best = max((k for k in sh if k.startswith(kind) and sh[k] is not None), key=sh.get, default=None)
        if best is not None and sh[best] > aligned + MARGIN:
            shifted = True
            add(f"{kind} shift", "error", f"recorded {kind} i matches trained {kind} i{best[len(kind):]} "
                                          f"(overlap {sh[best]:.3f}) better than {kind} i ({aligned:.3f})")
    if not shifted and aligned < chance + 0.25 * (1 - chance):
        add("another model", "error", f"overlap {aligned:.3f} is near chance K/E = {chance:.3f}")
    elif not shifted and r["flip_rate"] > 0.5:
        add("low agreement", "warning", f"{r['flip_rate']:.1%} of (token, layer) sets differ")
    dup = [(x["layer"], x["dup_rows"], x["zero_rows"]) for x in r["layers"] if x["dup_rows"]]
    if dup:
        add("zero padding", "error", "rows with repeated ids (of them all zeros) per layer: "
            + ", ".join(f"layer {i}: {d} ({z})" for i, d, z in dup))
    empty = [x["layer"] for x in r["layers"] if r["fed_positions"] and x["zero_rows"] == r["fed_positions"]]
    if empty:
        add("empty layer", "error", f"layers {empty} hold only zeros at every fed position")
    if r["bad_ids"]:
        add("bad ids", "error", f"{r['bad_ids']} (position, layer) rows have ids outside [0, {r['num_experts']})")
    kl = r["kl"]
    if kl["replay"] is not None and kl["no_replay"] is not None and kl["replay"] > kl["no_replay"] + 1e-9:
        add("replay does not help", "warning", f"kl with replay {kl['replay']:.3g} > without {kl['no_replay']:.3g}")
    return out


def render(r: dict) -> str:
    fmt = lambda x: "n/a" if x is None else f"{x:.3g}"  # noqa: E731
    lines = [f"r3.check: {r['batches']} batches, {r['fed_positions']} fed positions, {r['num_layers']} MoE layers, "
             f"top-{r['top_k']} of {r['num_experts']} (chance overlap {r['chance_overlap']:.3f})",
             "| layer | overlap | flip rate | repeated-id rows | all-zero rows |", "|---|---|---|---|---|"]
    lines += [f"| {x['layer']} | {x['overlap']:.3f} | {x['flip_rate']:.3f} | {x['dup_rows']} | {x['zero_rows']} |"
              for x in r["layers"]]
    lines.append(f"| all | {r['overlap']:.3f} | {r['flip_rate']:.3f} | | |")
    lines.append("shifted overlap: " + " | ".join(f"{k} {fmt(v)}" for k, v in r["shifts"].items()))
    lines.append(f"kl (k3) vs the engine's log-probs over {r['kl']['tokens']} tokens: no replay "
                 f"{fmt(r['kl']['no_replay'])} | replay {fmt(r['kl']['replay'])}")
    for f in r["findings"]:
        lines += [f"{f['severity'].upper()} {f['name']}: {f['detail']}", f"  likely: {f['means']}"]
    lines.append("verdict: " + ("OK, the routes line up with this model" if r["ok"] else "NOT OK, see above"))
    return "\n".join(lines)


def load_checker_model(args):
    if args.preset is not None:
        from r3.tasks.tasks import make_task
        from r3.train.warmup import load_model
        model, _ = load_model(args.preset, dense=False, task=make_task(args.task), task_spec=args.task,
                              warmup_steps=args.warmup_steps, init_seed=args.init_seed, cache_dir=args.cache_dir,
                              progress=False)
        return model
    if os.path.isdir(args.model):
        from r3.scale.hf import load_pretrained
        return load_pretrained(args.model, dtype=torch.float32).eval()
    from r3.train.warmup import load_model
    return load_model(args.arch, path=args.model, dense=False, task=None, task_spec="", warmup_steps=0, init_seed=0,
                      arch=args.arch)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", required=True, help="a rollout folder, or a folder of them")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="toy preset, rebuilt and warmed up as rollout.py does")
    src.add_argument("--model", help="HF Qwen3-MoE folder, or an r3 safetensors checkpoint file")
    ap.add_argument("--arch", help="preset architecture of a checkpoint file without a config in its metadata")
    ap.add_argument("--task", default=RolloutConfig.task,
                    help="--preset: the warm-up task (default: rollout.py's, %(default)s)")
    ap.add_argument("--warmup-steps", type=int, default=RolloutConfig.warmup_steps,
                    help="--preset: warm-up steps (default: rollout.py's, %(default)s)")
    ap.add_argument("--init-seed", type=int, default=RolloutConfig.init_seed,
                    help="--preset: init seed (default: rollout.py's, %(default)s)")
    ap.add_argument("--cache-dir", default=".cache/warmup", help="--preset: warm-up cache")
    ap.add_argument("--json", help="also write the report here")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args(argv)
    check_flags(ap, args, dict(warmup_steps=INT_GE0, init_seed=INT_GE0, threads=THREADS))
    torch.set_num_threads(args.threads)
    batches = find_batches(args.rollouts)  # a missing or damaged folder is refused before any warm-up is built
    report = check_alignment(load_checker_model(args).float().eval(), batches)
    print(render(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
