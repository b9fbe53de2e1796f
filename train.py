"""GRPO on a toy task with Rollout Routing Replay.  `python train.py --r3`

One step, top to bottom:
  1. draw prompts; the engine (its own weights at --rollout-dtype) samples G responses each, recording routes
  2. rewards → group-normalised advantages
  3. old-policy pass of the fp32 trainer (no grad) with the replay mode's routing → π_old, mismatch metrics
  4. --mini-steps optimizer steps on minibatches, each forward replaying: the rollout routes (r3), the routes of
     the old-policy pass (r2), or nothing (none)
  5. weight sync trainer → engine; collapse guard; one log line, metrics.jsonl, checkpoint every --save-every

A real model: `--model PATH` (an HF Qwen3-MoE folder with tokenizer.json) with `--task jsonl:FILE`; launched by
`torchrun --nproc_per_node=N`, the trainer is sharded with FSDP2 and each rank rolls out its own data shards
(`--shards`, see r3/scale.py); rank 0 alone writes files. `--dry-run` prints the per-GPU memory plan and exits.
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
from r3.fsdp import clip_grad_norm, setup_distributed
from r3.grpo import group_advantages, loss_denominator, policy_loss
from r3.guard import CollapseGuard
from r3.hf import load_config, load_tokenizer
from r3.jsonl_task import make_jsonl_task
from r3.memory import format_plan, memory_plan
from r3.metrics import kl_k3, masked_mean, mismatch
from r3.model import PRESETS
from r3.plots import plot_run, read_metrics
from r3.scale import (FSDP_PARAM_DTYPES, global_mean, global_sum, load_policy, my_shards, save_hf_checkpoint,
                      shard_generator_name, shard_seed, sync_engine)
from r3.score import FULL_VOCAB_MAX, token_logp
from r3.tasks import EOS, PAD, make_task, reward_batch
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
    a("--grad-clip", type=float, default=1.0,
      help="max grad norm (the logged grad_norm is the largest pre-clip norm among the step's mini-steps)")
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
    # the real-model path: HF checkpoint, jsonl prompts, FSDP2 under torchrun (r3/scale.py)
    a("--model", default=None, help="HF Qwen3-MoE checkpoint folder (config.json, *.safetensors, tokenizer.json) "
                                    "instead of a toy preset; needs --task jsonl:FILE; no warm-up is run")
    a("--max-new-tokens", type=int, default=None, help="response length limit (default: the task's; jsonl: 1024)")
    a("--shards", type=int, default=None,
      help="cut each step's prompts into N data shards, each sampled with its own generator; under torchrun rank r "
           "takes shards r, r+W, ... and gradient-accumulates them. The same N gives the same run at any world "
           "size (default: the world size; 1 = the toy loop as before)")
    a("--logprob-chunk", type=int, default=None,
      help="positions per lm_head chunk for trainer log-probs, so [B, T, V] logits never exist (then kl_full is "
           "None, entropy is computed chunked); 0 = full logits. Default: 1024 if vocab > 4096, else 0")
    a("--fsdp-param-dtype", choices=["bf16", "fp32"], default="bf16",
      help="under torchrun: FSDP2 compute dtype over fp32 master weights (gradients are reduced in fp32)")
    a("--activation-checkpointing", action="store_true", help="under torchrun: recompute each block in backward")
    a("--dry-run", action="store_true", help="print the per-GPU memory plan for --model (config.json only) or "
                                             "--preset and exit")
    a("--world-size", type=int, default=None, help="--dry-run outside torchrun: GPUs to plan for (default 1)")
    a("--plan-seq-len", type=int, default=4096, help="--dry-run: tokens per sequence (prompt + response)")
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
    for name in ("max_new_tokens", "shards", "world_size", "plan_seq_len"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.logprob_chunk is not None and args.logprob_chunk < 0:
        p.error("--logprob-chunk must be >= 0")
    jsonl = args.task.startswith("jsonl:")
    if args.rollouts and (args.model or (args.shards or 1) > 1):
        p.error("--rollouts trains a toy preset in one process on whole batches: drop --model / --shards")
    if args.model and args.dense:
        p.error("--dense builds the dense twin of a toy preset; an HF checkpoint has no dense twin")
    if args.model and not jsonl and not args.dry_run:
        p.error(f"--model needs --task jsonl:FILE: the toy task {args.task!r} has its own 16-token vocabulary, "
                f"not the checkpoint's tokenizer")
    if jsonl and not args.model and not args.dry_run:
        p.error(f"--task {args.task} needs --model PATH (a checkpoint with tokenizer.json): the toy presets have "
                f"no tokenizer for its text prompts")
    return args


@torch.no_grad()
def validate(model, engine, examples, *, seed, step, max_new_tokens, eos_ids, pad_id, temperature, top_p, chunk,
             device):
    """val/kl: k3 KL between the normal and the R3-replayed train forward on fresh held-out rollouts."""
    if model.cfg.dense:
        return None
    g = torch.Generator(device=device).manual_seed(seed * 1_000_003 + step)
    b = engine.generate([e.prompt for e in examples], max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                        pad_id=pad_id, group_size=2, temperature=temperature, top_p=top_p, generator=g)
    normal = token_logp(model, b.tokens, b.attn_mask, None, temperature=temperature, chunk=chunk)[0]
    replay = token_logp(model, b.tokens, b.attn_mask, b.routes, temperature=temperature, chunk=chunk)[0]
    return kl_k3(normal, replay, b.loss_mask)


def dry_run(args):
    """Print `memory_plan` for --model's config.json (no weights read) or --preset, at the torchrun world size."""
    env_world = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else None
    if env_world and args.world_size and env_world != args.world_size:
        sys.exit(f"error: --world-size {args.world_size} disagrees with torchrun's WORLD_SIZE {env_world}")
    world = env_world or args.world_size or 1
    cfg = load_config(args.model)[0] if args.model else PRESETS[args.preset]
    cfg = cfg.dense_twin() if args.dense else cfg
    shards = args.shards or world
    rows = math.ceil(args.prompts_per_step * args.group_size / shards / args.mini_steps)
    plan = memory_plan(cfg, world, param_dtype=FSDP_PARAM_DTYPES[args.fsdp_param_dtype], seq_len=args.plan_seq_len,
                       micro_batch=rows, vocab_chunk=args.logprob_chunk or 1024,
                       activation_checkpointing=args.activation_checkpointing)
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"dry run: {args.model or 'preset ' + args.preset}; rows per training forward: {rows} "
              f"(prompts-per-step × group-size / shards / mini-steps; raise --shards to cut it)")
        print(format_plan(plan))


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    torchrun = "RANK" in os.environ
    if torchrun and not args.model:
        sys.exit("error: under torchrun, pass --model PATH (FSDP runs start from an HF checkpoint; the toy presets "
                 "run in one process)")
    if torchrun and args.resume:
        sys.exit("error: --resume is not supported under torchrun: FSDP runs save model weights only (OUT/hf), not "
                 "the optimizer and RNG state a bit-identical resume needs. Start a new run with --model OUT/hf")
    mode = "dense" if args.dense else args.replay
    name = args.task.replace(":", "").replace("/", "_")
    out = args.out or os.path.join("runs", f"{name}-{mode}-{args.rollout_dtype}-s{args.seed}")
    ckpt_path, metrics_path = os.path.join(out, "ckpt.pt"), os.path.join(out, "metrics.jsonl")
    if os.path.exists(metrics_path) and not (args.resume or args.overwrite):
        sys.exit(f"error: {out} already holds a run; pass --resume to continue it or --overwrite to replace it")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    rank, world, device = setup_distributed() if args.model else (0, 1, torch.device("cpu"))
    lead = rank == 0  # only rank 0 writes files and prints
    if lead:
        os.makedirs(out, exist_ok=True)
    plain, warm_path = None, None
    if args.model:
        tok = load_tokenizer(args.model)
        task = make_jsonl_task(args.task, tok, max_new_tokens=args.max_new_tokens or 1024)
        eos_ids, pad_id = tok.eos_ids, tok.pad_id
        # collective under torchrun (broadcast load), so no rank writes below before every rank checked `out`
        model, engine, plain = load_policy(args.model, world=world, device=device, rollout_dtype=args.rollout_dtype,
                                           fsdp_param_dtype=args.fsdp_param_dtype,
                                           activation_checkpointing=args.activation_checkpointing)
        cfg = model.cfg
        if tok.tok.get_vocab_size() > cfg.vocab_size or max(*eos_ids, pad_id) >= cfg.vocab_size:
            sys.exit(f"error: the tokenizer of {args.model} ({tok.tok.get_vocab_size()} tokens, EOS {eos_ids}, pad "
                     f"{pad_id}) does not fit the model's vocab_size {cfg.vocab_size}")
    else:
        task = make_task(args.task)
        eos_ids, pad_id = (EOS,), PAD
        cfg = PRESETS[args.preset]
        cfg = cfg.dense_twin() if args.dense else cfg
        model, warm_path = warmed_up_model(cfg, task, args.task, steps=args.warmup_steps, seed=args.seed)
        engine = Engine(model, args.rollout_dtype)
    max_new = args.max_new_tokens or task.max_new_tokens
    chunk = args.logprob_chunk if args.logprob_chunk is not None else (1024 if cfg.vocab_size > FULL_VOCAB_MAX else 0)
    num_shards = args.shards or world
    if args.prompts_per_step % num_shards:
        sys.exit(f"error: --prompts-per-step {args.prompts_per_step} does not split into {num_shards} equal shards")
    mine = my_shards(num_shards, rank, world)
    disk = None
    if args.rollouts:  # a run that refuses to start beats one that silently trains without replay
        disk = load_rollouts(args.rollouts, cfg, require_routes=args.replay == "r3")
        for b in disk:  # π_old must be scored on the engine's scale, or kl and the IS weights are silently wrong
            if abs(float(b.meta.get("temperature", 1.0)) - args.temperature) > 1e-9:
                sys.exit(f"error: {b.meta['source']} was sampled at temperature {b.meta.get('temperature')}, but "
                         f"--temperature is {args.temperature}: pass the rollout's temperature")
        print(f"training on {len(disk)} rollout batch(es) from {args.rollouts}; the engine only serves val/kl")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    gens = dict(data=torch.Generator().manual_seed(args.seed))  # the same on every rank: it draws every prompt
    for s in mine:
        gens[shard_generator_name(s)] = torch.Generator(device=device).manual_seed(shard_seed(args.seed, s))
    val_examples = task.sample(args.val_prompts, torch.Generator().manual_seed(10_000 + args.seed))
    guard = CollapseGuard(reward_drop=args.guard_reward_drop, kl_max=args.guard_kl_max)
    clip_low = args.clip_low if args.clip_low is not None else (3e-4 if args.loss == "gspo" else 0.2)
    clip_high = args.clip_high if args.clip_high is not None else (4e-4 if args.loss == "gspo" else 0.28)
    save_dtype = load_config(args.model)[1] if args.model else None
    eos = torch.tensor(eos_ids, device=device)

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
    if start == 0 and lead:
        open(metrics_path, "w").close()
        with open(os.path.join(out, "args.json"), "w") as f:
            json.dump(dict(vars(args), model=dataclasses.asdict(cfg), model_path=args.model, world_size=world,
                           warmup_checkpoint=warm_path), f, indent=1)

    def save(step_done, name=None):
        """One process: ckpt.pt (resumable), plus OUT/hf with --model. FSDP: OUT/hf only (every rank calls)."""
        if world == 1:
            save_checkpoint(os.path.join(out, name + ".pt") if name else ckpt_path, model=model, optimizer=opt,
                            engine=engine, generators=gens, step=step_done, extra=dict(guard=guard.state_dict()))
        if args.model:
            save_hf_checkpoint(model, os.path.join(out, name or "hf"), dtype=save_dtype)

    stopped_on = None
    bar = tqdm(range(start, args.steps), desc=f"{mode}/{args.rollout_dtype}", initial=start, total=args.steps,
               disable=not lead)
    for step in bar:
        t0 = time.perf_counter()
        # 1. rollout (or read one from disk): every rank draws the same prompts, then samples only its own shards
        examples = task.sample(args.prompts_per_step, gens["data"]) if disk is None else None
        shards, tok_parts, row_parts, group_parts = [], [], [], []
        for s in mine:
            if disk is None:
                per = len(examples) // num_shards
                ex = examples[s * per:(s + 1) * per]
                batch = engine.generate([e.prompt for e in ex], max_new_tokens=max_new, eos_ids=eos_ids,
                                        pad_id=pad_id, group_size=args.group_size, temperature=args.temperature,
                                        top_p=args.top_p, generator=gens[shard_generator_name(s)],
                                        keep_logits=chunk == 0)
                exact = reward_batch(task, batch, ex)  # 2. rewards and advantages
            else:
                batch = disk[step % len(disk)]
                exact = None  # rewards come with the rollouts
            adv, adv_metrics = group_advantages(batch.rewards, batch.group, normalize_std=args.loss != "dr_grpo")
            # 3. old-policy pass (also the mismatch measurement: trainer as it will be used vs engine)
            mask = batch.loss_mask
            with torch.no_grad():
                old_logp, old_logp_V, old_routes, ent = token_logp(
                    model, batch.tokens, batch.attn_mask, batch.routes if args.replay == "r3" else None,
                    temperature=args.temperature, chunk=chunk, with_entropy=True)
                own_routes = old_routes
                if args.replay == "r3":  # flips compare the trainer's *own* routing with the engine's
                    own_routes = model(batch.tokens[:, :-1], valid_BT=batch.attn_mask[:, :-1], return_hidden=True)[1]
            mm = mismatch(old_logp, batch.rollout_logp, mask, own_routes, batch.routes, old_logp_V,
                          batch.rollout_logits)
            replay_routes = {"none": None, "r3": batch.routes, "r2": old_routes}[args.replay]
            shards.append(dict(batch=batch, adv=adv, old_logp=old_logp, routes=replay_routes))
            lengths = batch.response_mask.sum(1).float()
            ended = (torch.isin(batch.tokens, eos) & batch.response_mask).any(1)
            tok_parts.append((dict(**mm, entropy=masked_mean(ent, mask)), float(mask.sum())))
            row_parts.append((dict(reward=float(batch.rewards.mean()), response_length=float(lengths.mean()),
                                   exact=exact,
                                   runaway_frac=float(((lengths >= max_new) & ~ended).float().mean())), len(batch)))
            group_parts.append((adv_metrics, len(batch.group.unique())))
        # 4. policy update: each minibatch takes the same rows of every shard; one loss over the whole step
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / max(1, args.lr_warmup))
        rows_of = [torch.randperm(len(shards[0]["batch"]), generator=gens["data"]).chunk(args.mini_steps)
                   for _ in range(num_shards)]  # every rank draws all shards' orders: `data` stays in step
        losses, grad_norms, loss_metrics = [], [], []
        for k in range(len(rows_of[0])):
            picked = [(sh, rows_of[s][k]) for s, sh in zip(mine, shards)]
            dens = [loss_denominator(sh["old_logp"][rows], sh["batch"].rollout_logp[rows],
                                     sh["batch"].loss_mask[rows], loss=args.loss, is_correction=args.is_correction,
                                     is_cap=args.is_cap, max_len=max_new) for sh, rows in picked]
            denominator = None if num_shards == 1 else max(1.0, global_sum(sum(dens)))
            opt.zero_grad(set_to_none=True)
            loss_sum, parts = 0.0, []
            for (sh, rows), d in zip(picked, dens):
                b = sh["batch"]
                logp = token_logp(model, b.tokens[rows], b.attn_mask[rows],
                                  None if sh["routes"] is None else sh["routes"][rows],
                                  temperature=args.temperature, chunk=chunk)[0]
                loss, lm = policy_loss(logp, sh["old_logp"][rows], sh["adv"][rows], b.loss_mask[rows],
                                       loss=args.loss, clip_low=clip_low, clip_high=clip_high,
                                       rollout_logp_BT=b.rollout_logp[rows], is_correction=args.is_correction,
                                       is_cap=args.is_cap, max_len=max_new, denominator=denominator)
                (loss * world if world > 1 else loss).backward()  # FSDP averages grads over ranks: ×world = sum
                loss_sum += float(loss.detach())
                parts.append((lm, d))
            loss_value = global_sum(loss_sum)
            gn = clip_grad_norm(model.parameters(), args.grad_clip)
            if math.isfinite(gn) and math.isfinite(loss_value):
                opt.step()  # a non-finite step is skipped (and reported by the guard), never applied
            losses.append(loss_value)
            grad_norms.append(gn)
            loss_metrics.append(dict(global_mean(parts), **{"grpo/loss": loss_value}))
        # 5. sync, log, guard, checkpoint
        sync_engine(model, engine, plain)
        tm, rm = global_mean(tok_parts), global_mean(row_parts)
        m = dict(step=step, reward=rm["reward"], **{k: tm[k] for k in mm},
                 entropy=tm["entropy"], grad_norm=max(grad_norms), loss=sum(losses) / len(losses),
                 response_length=rm["response_length"],
                 clip_frac=sum(x["grpo/clip_frac"] for x in loss_metrics) / len(loss_metrics),
                 exact=rm["exact"], runaway_frac=rm["runaway_frac"],
                 lr=opt.param_groups[0]["lr"], **global_mean(group_parts),
                 **{k: sum(x[k] for x in loss_metrics) / len(loss_metrics) for k in loss_metrics[0]
                    if k not in ("grpo/loss", "grpo/clip_frac")})  # logged above as loss and clip_frac
        if args.val_every and (step + 1) % args.val_every == 0:
            m["val/kl"] = validate(model, engine, val_examples, seed=args.seed, step=step, max_new_tokens=max_new,
                                   eos_ids=eos_ids, pad_id=pad_id, temperature=args.temperature, top_p=args.top_p,
                                   chunk=chunk, device=device)
        m["symptoms"] = guard.check(m)
        m["step_time"] = time.perf_counter() - t0
        if lead:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(m) + "\n")
        bar.set_postfix(reward=f"{m['reward']:.3f}", kl=f"{m['kl']:.1e}")
        if not args.quiet and lead:
            flips = "-" if m["router_flip_rate"] is None else f"{m['router_flip_rate']:.2%}"
            exact_s = "-" if m["exact"] is None else f"{m['exact']:.2f}"
            tqdm.write(f"step {step:4d} | reward {m['reward']:.3f} | exact {exact_s} | kl {m['kl']:.2e} | "
                       f"F(2) {m['extreme_frac']:.2%} | flips {flips} | gn {m['grad_norm']:.2f} | "
                       f"len {m['response_length']:.1f} | ent {m['entropy']:.3f} | {m['step_time']:.2f}s")
        if guard.new:  # a symptom's onset: keep the weights as they were the moment it appeared
            save(step + 1, f"collapse_step{step}")
            if lead:
                tqdm.write(f"collapse guard: {', '.join(guard.new)} at step {step} (checkpoint saved)")
            if args.on_collapse == "stop":
                save(step + 1)
                stopped_on = guard.new
                break
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save(step + 1)
    bar.close()
    if lead:
        with open(os.path.join(out, "done.json"), "w") as f:
            json.dump(dict(steps=len(read_metrics(metrics_path)), stopped_on=stopped_on, world_size=world), f)
        if not args.no_plot:
            plot_run(read_metrics(metrics_path), os.path.join(out, "metrics.png"), title=f"{out}")
            print(f"wrote {os.path.join(out, 'metrics.png')}")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return out


if __name__ == "__main__":
    main()
