"""GRPO on a toy task with Rollout Routing Replay.  `python train.py --r3`

One step, top to bottom:
  1. draw prompts; the engine (its own weights at --rollout-dtype) samples G responses each, recording routes
  2. rewards → group-normalised advantages
  3. old-policy pass of the fp32 trainer (no grad) with the replay mode's routing → π_old, mismatch metrics
  4. --mini-steps optimizer steps on minibatches, each forward replaying: the rollout routes (r3), the routes of
     the old-policy pass (r2), or nothing (none)
  5. weight sync trainer → engine; collapse guard; one log line, metrics.jsonl, checkpoint every --save-every
"""
import argparse
import dataclasses
import json
import math
import os
import sys
import time

import torch
from tqdm import tqdm

from r3.batch import load_rollouts
from r3.checkpoint import load_checkpoint, save_checkpoint
from r3.engine import ROLLOUT_DTYPES, Engine
from r3.grpo import group_advantages, policy_loss
from r3.guard import CollapseGuard
from r3.metrics import entropy, kl_k3, mismatch
from r3.model import PRESETS
from r3.plots import plot_run, read_metrics
from r3.tasks import EOS, PAD, make_task
from r3.warmup import warmed_up_model


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--r3", action="store_true", help="shorthand for --replay r3")
    a("--replay", choices=["none", "r2", "r3"], default="none",
      help="none: router picks experts; r3: replay the rollout engine's routes; r2: replay the routes of the "
           "trainer's own old-policy pass (fixes drift across mini-steps, not the engine mismatch)")
    a("--rollout-dtype", choices=sorted(ROLLOUT_DTYPES), default="bf16", help="engine numerics (trainer is fp32)")
    a("--dense", action="store_true", help="train the dense twin (matched active parameters, no router)")
    a("--preset", choices=sorted(PRESETS), default="toy", help="model size preset")
    a("--task", default="sort", help="toy task: sort | reverse | add, optionally NAME:MIN-MAX digits")
    a("--steps", type=int, default=200, help="RL steps")
    a("--prompts-per-step", type=int, default=16, help="prompts per step")
    a("--group-size", type=int, default=8, help="samples per prompt (GRPO group size G)")
    a("--lr", type=float, default=3e-4, help="AdamW learning rate")
    a("--lr-warmup", type=int, default=10, help="linear learning-rate warm-up steps (fresh Adam state is jumpy)")
    a("--grad-clip", type=float, default=1.0, help="max grad norm (the logged grad_norm is before clipping)")
    a("--seed", type=int, default=0, help="seed for init, warm-up, data and sampling")
    a("--warmup-steps", type=int, default=80, help="supervised warm-up steps before RL (cached and shared)")
    a("--mini-steps", type=int, default=4, help="optimizer steps per rollout batch (minibatches); >1 is off-policy")
    a("--loss", choices=["grpo", "dr_grpo", "gspo"], default="grpo", help="policy loss (see r3/grpo.py)")
    a("--clip-low", type=float, default=None, help="clip ε low (default 0.2; gspo 3e-4)")
    a("--clip-high", type=float, default=None, help="clip ε high (default 0.28; gspo 4e-4)")
    a("--is-correction", choices=["none", "tis", "icepop", "mis"], default="none",
      help="rollout-vs-train importance correction (tis truncates at C; icepop/mis mask outside [1/C, C])")
    a("--is-cap", type=float, default=2.0, help="C for --is-correction")
    a("--temperature", type=float, default=1.0, help="sampling temperature (the trainer scores at the same)")
    a("--top-p", type=float, default=1.0, help="nucleus sampling")
    a("--val-every", type=int, default=25, help="every N steps log val/kl: normal vs replayed train forward on "
                                                "held-out rollouts (0 = never)")
    a("--val-prompts", type=int, default=32, help="held-out prompts for val/kl")
    a("--on-collapse", choices=["stop", "continue"], default="continue",
      help="when the collapse guard fires: save a checkpoint, log the symptom, then stop or continue")
    a("--guard-reward-drop", type=float, default=0.3, help="guard: reward EMA this far below its running peak")
    a("--guard-kl-max", type=float, default=1.0, help="guard: mismatch kl above this")
    a("--rollouts", default=None, help="train on rollouts read from this folder (rollout.py output, or converted "
                                         "SGLang/vLLM responses; one batch folder per step, cycled) instead of "
                                         "generating them; with --r3 every sample must carry routes that fit the model")
    a("--out", default=None, help="run folder (default runs/TASK-MODE-DTYPE-sSEED)")
    a("--resume", action="store_true", help="continue from OUT/ckpt.pt (bit-identical metrics on CPU)")
    a("--overwrite", action="store_true", help="replace an existing run folder instead of refusing")
    a("--save-every", type=int, default=50, help="checkpoint every N steps (atomic; also at the end)")
    a("--threads", type=int, default=1, help="torch intra-op threads (the toy model gains nothing from more; run "
                                              "arms in parallel instead)")
    a("--no-plot", action="store_true", help="skip the PNG plots at the end")
    a("--quiet", action="store_true", help="no per-step lines (the progress bar stays)")
    args = p.parse_args(argv)
    if args.r3:
        if args.replay not in ("none", "r3"):
            p.error(f"--r3 conflicts with --replay {args.replay}")
        args.replay = "r3"
    if args.dense and args.replay != "none":
        p.error("--dense has no router, so there are no routes to replay: drop --r3/--replay")
    for name in ("steps", "prompts_per_step", "group_size", "mini_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.group_size < 2:
        p.error("--group-size must be >= 2: GRPO advantages need a group")
    return args


def token_logp(model, batch, rows, routes, temperature):
    """Trainer log-probs of the sampled tokens [b, T-1], full log-softmax [b, T-1, V], routes used."""
    logits, used = model(batch.tokens[rows, :-1], valid_BT=batch.attn_mask[rows, :-1],
                         routes_BTLK=None if routes is None else routes[rows])
    logp_V = (logits.float() / temperature).log_softmax(-1)
    return logp_V.gather(-1, batch.tokens[rows, 1:, None])[..., 0], logp_V, used


@torch.no_grad()
def validate(model, engine, task, examples, args, step):
    """val/kl: k3 KL between the normal and the R3-replayed train forward on fresh held-out rollouts."""
    if model.cfg.dense:
        return None
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    b = engine.generate([e.prompt for e in examples], max_new_tokens=task.max_new_tokens, eos_ids=(EOS,),
                        pad_id=PAD, group_size=2, temperature=args.temperature, top_p=args.top_p, generator=g)
    rows = slice(None)
    normal, _, _ = token_logp(model, b, rows, None, args.temperature)
    replay, _, _ = token_logp(model, b, rows, b.routes, args.temperature)
    return kl_k3(normal, replay, b.loss_mask)


def main(argv=None):
    args = parse_args(argv)
    mode = "dense" if args.dense else args.replay
    out = args.out or os.path.join("runs", f"{args.task.replace(':', '')}-{mode}-{args.rollout_dtype}-s{args.seed}")
    ckpt_path, metrics_path = os.path.join(out, "ckpt.pt"), os.path.join(out, "metrics.jsonl")
    if os.path.exists(metrics_path) and not (args.resume or args.overwrite):
        sys.exit(f"error: {out} already holds a run; pass --resume to continue it or --overwrite to replace it")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    task = make_task(args.task)
    cfg = PRESETS[args.preset]
    cfg = cfg.dense_twin() if args.dense else cfg
    model, warm_path = warmed_up_model(cfg, task, args.task, steps=args.warmup_steps, seed=args.seed)
    engine = Engine(model, args.rollout_dtype)
    disk = None
    if args.rollouts:  # a run that refuses to start beats one that silently trains without replay
        disk = load_rollouts(args.rollouts, cfg, require_routes=args.replay == "r3")
        print(f"training on {len(disk)} rollout batch(es) from {args.rollouts}; the engine only serves val/kl")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    gens = dict(data=torch.Generator().manual_seed(args.seed), sample=torch.Generator().manual_seed(args.seed + 1))
    val_examples = task.sample(args.val_prompts, torch.Generator().manual_seed(10_000 + args.seed))
    guard = CollapseGuard(reward_drop=args.guard_reward_drop, kl_max=args.guard_kl_max)
    clip_low = args.clip_low if args.clip_low is not None else (3e-4 if args.loss == "gspo" else 0.2)
    clip_high = args.clip_high if args.clip_high is not None else (4e-4 if args.loss == "gspo" else 0.28)

    start = 0
    if args.resume and os.path.exists(ckpt_path):
        start, extra = load_checkpoint(ckpt_path, model=model, optimizer=opt, engine=engine, generators=gens)
        guard.load_state_dict(extra["guard"])
        with open(metrics_path) as f:  # drop lines logged after the checkpoint; they are recomputed identically
            kept = [line for line in f if line.strip() and json.loads(line)["step"] < start]
        with open(metrics_path, "w") as f:
            f.writelines(kept)
        print(f"resumed {out} at step {start}")
    elif args.resume:
        print(f"no checkpoint in {out}; starting from scratch")
    if start == 0:
        open(metrics_path, "w").close()
        with open(os.path.join(out, "args.json"), "w") as f:
            json.dump(dict(vars(args), model=dataclasses.asdict(cfg), warmup_checkpoint=warm_path), f, indent=1)

    def save(step_done, path=ckpt_path):
        save_checkpoint(path, model=model, optimizer=opt, engine=engine, generators=gens, step=step_done,
                        extra=dict(guard=guard.state_dict()))

    stopped_on = None
    bar = tqdm(range(start, args.steps), desc=f"{mode}/{args.rollout_dtype}", initial=start, total=args.steps)
    for step in bar:
        t0 = time.perf_counter()
        # 1. rollout (or read one from disk), 2. rewards and advantages
        if disk is None:
            examples = task.sample(args.prompts_per_step, gens["data"])
            batch = engine.generate([e.prompt for e in examples], max_new_tokens=task.max_new_tokens,
                                    eos_ids=(EOS,), pad_id=PAD, group_size=args.group_size,
                                    temperature=args.temperature, top_p=args.top_p, generator=gens["sample"],
                                    keep_logits=cfg.vocab_size <= 4096)
            scored = [task.reward(batch.tokens[i][batch.response_mask[i]].tolist(), examples[int(batch.group[i])])
                      for i in range(len(batch))]
            batch.rewards = torch.tensor([r for r, _ in scored])
        else:
            batch = disk[step % len(disk)]
            scored = None  # rewards come with the rollouts
        adv, adv_metrics = group_advantages(batch.rewards, batch.group, normalize_std=args.loss != "dr_grpo")
        # 3. old-policy pass (also the mismatch measurement: trainer as it will be used vs engine)
        mask = batch.loss_mask
        everyone = slice(None)
        with torch.no_grad():
            old_logp, old_logp_V, old_routes = token_logp(model, batch, everyone,
                                                          batch.routes if args.replay == "r3" else None,
                                                          args.temperature)
            own_routes = old_routes
            if args.replay == "r3":  # flips compare the trainer's *own* routing with the engine's
                own_routes = model(batch.tokens[:, :-1], valid_BT=batch.attn_mask[:, :-1])[1]
        mm = mismatch(old_logp, batch.rollout_logp, mask, own_routes, batch.routes, old_logp_V, batch.rollout_logits)
        replay_routes = {"none": None, "r3": batch.routes, "r2": old_routes}[args.replay]
        # 4. policy update
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / max(1, args.lr_warmup))
        losses, grad_norms, loss_metrics = [], [], []
        for rows in torch.randperm(len(batch), generator=gens["data"]).chunk(args.mini_steps):
            logp, _, _ = token_logp(model, batch, rows, replay_routes, args.temperature)
            loss, lm = policy_loss(logp, old_logp[rows], adv[rows], mask[rows], loss=args.loss, clip_low=clip_low,
                                   clip_high=clip_high, rollout_logp_BT=batch.rollout_logp[rows],
                                   is_correction=args.is_correction, is_cap=args.is_cap,
                                   max_len=task.max_new_tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip))
            if math.isfinite(gn) and math.isfinite(float(loss)):
                opt.step()  # a non-finite step is skipped (and reported by the guard), never applied
            losses.append(float(loss))
            grad_norms.append(gn)
            loss_metrics.append(lm)
        # 5. sync, log, guard, checkpoint
        engine.sync(model)
        lengths = batch.response_mask.sum(1).float()
        ended = (batch.tokens * batch.response_mask == EOS).any(1)
        m = dict(step=step, reward=float(batch.rewards.mean()), **mm,
                 entropy=entropy(old_logp_V, mask), grad_norm=max(grad_norms), loss=sum(losses) / len(losses),
                 response_length=float(lengths.mean()),
                 clip_frac=sum(x["grpo/clip_frac"] for x in loss_metrics) / len(loss_metrics),
                 exact=None if scored is None else sum(i["exact"] for _, i in scored) / len(scored),
                 runaway_frac=float(((lengths >= task.max_new_tokens) & ~ended).float().mean()),
                 lr=opt.param_groups[0]["lr"], **adv_metrics,
                 **{k: sum(x[k] for x in loss_metrics) / len(loss_metrics) for k in loss_metrics[0]})
        if args.val_every and (step + 1) % args.val_every == 0:
            m["val/kl"] = validate(model, engine, task, val_examples, args, step)
        m["symptoms"] = guard.check(m)
        m["step_time"] = time.perf_counter() - t0
        with open(metrics_path, "a") as f:
            f.write(json.dumps(m) + "\n")
        bar.set_postfix(reward=f"{m['reward']:.3f}", kl=f"{m['kl']:.1e}")
        if not args.quiet:
            flips = "-" if m["router_flip_rate"] is None else f"{m['router_flip_rate']:.2%}"
            exact = "-" if m["exact"] is None else f"{m['exact']:.2f}"
            tqdm.write(f"step {step:4d} | reward {m['reward']:.3f} | exact {exact} | kl {m['kl']:.2e} | "
                       f"F(2) {m['extreme_frac']:.2%} | flips {flips} | gn {m['grad_norm']:.2f} | "
                       f"len {m['response_length']:.1f} | ent {m['entropy']:.3f} | {m['step_time']:.2f}s")
        if guard.new:  # a symptom's onset: keep the weights as they were the moment it appeared
            save(step + 1, os.path.join(out, f"collapse_step{step}.pt"))
            tqdm.write(f"collapse guard: {', '.join(guard.new)} at step {step} (checkpoint saved)")
            if args.on_collapse == "stop":
                save(step + 1)
                stopped_on = guard.new
                break
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save(step + 1)
    bar.close()
    with open(os.path.join(out, "done.json"), "w") as f:
        json.dump(dict(steps=len(read_metrics(metrics_path)), stopped_on=stopped_on), f)
    if not args.no_plot:
        plot_run(read_metrics(metrics_path), os.path.join(out, "metrics.png"), title=f"{out}")
        print(f"wrote {os.path.join(out, 'metrics.png')}")
    return out


if __name__ == "__main__":
    main()
