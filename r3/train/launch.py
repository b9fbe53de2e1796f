"""What train.py loads before step 0, each piece checked against the model before any work: the policy and its
rollout engine, the task and its held-out prompts, and (--rollouts) the batches read from disk.

  load_policy_and_task(cfg, world, device)   `Policy`: a toy preset warmed up on its task (cached), or an HF
                                             Qwen3-MoE checkpoint with a jsonl task (FSDP2-sharded under torchrun)
  read_disk_rollouts(cfg, policy, shards)    the batches of a rollouts folder, whole, at the run's temperature,
                                             sampled by this model (meta.model_digest), cut into the data shards
  check_mini_steps(k, rows, what)            --mini-steps beyond a shard's rows is refused
These take train.py's `TrainConfig`: they are its set-up, kept apart so that the script reads as its loop. A refusal
is one `error: ...` line and exit 1 (`sys.exit`, shown by `r3.errors.run_main` without a traceback).
"""
import json
import math
import os
import sys
from dataclasses import asdict, fields
from typing import NamedTuple

import torch

from r3.rollout.batch import load_rollouts, rollout_folders
from r3.runs.checkpoint import model_digest
from r3.train.collect import check_shardable
from r3.train.config import RUN_DEFINING, TrainConfig
from r3.rollout.engine import Engine
from r3.train.evaluate import heldout_examples
from r3.scale.fsdp import load_policy
from r3.scale.hf import load_config, load_tokenizer
from r3.runs.runfolder import check_output_folder, check_resume
from r3.tasks.jsonl_task import make_jsonl_task
from r3.rollout.remote import make_engine
from r3.tasks.tasks import EOS, PAD, make_task
from r3.train.warmup import preset_config, warmed_up_model


class Policy(NamedTuple):
    model: torch.nn.Module
    engine: object
    plain: torch.nn.Module | None
    task: object
    eos_ids: tuple[int, ...]
    pad_id: int
    heldout: list
    warm_path: str | None


def load_policy_and_task(cfg: TrainConfig, world: int, device: torch.device) -> Policy:
    """The trainer, its engine and the task; prompt lengths are checked against the model before any work."""
    if cfg.model:
        model_cfg = load_config(cfg.model)[0]  # first: a folder that is not a Qwen3-MoE checkpoint says so
        tok = load_tokenizer(cfg.model)
        task = make_jsonl_task(cfg.task, tok, max_new_tokens=cfg.max_new_tokens or 1024)
        eval_task = make_jsonl_task(cfg.eval_task, tok, max_new_tokens=task.max_new_tokens) if cfg.eval_task else None
        check_fits([task, eval_task], model_cfg, cfg.max_new_tokens)
        # collective under torchrun (broadcast load), so no rank writes below before every rank checked `out`
        model, plain = load_policy(cfg.model, world=world, device=device, fsdp_param_dtype=cfg.fsdp_param_dtype,
                                   activation_checkpointing=cfg.activation_checkpointing,
                                   plain_copy=cfg.engine == "local")
        V = model.cfg.vocab_size
        if tok.tok.get_vocab_size() > V or max(*tok.eos_ids, tok.pad_id) >= V:
            sys.exit(f"error: the tokenizer of {cfg.model} ({tok.tok.get_vocab_size()} tokens, EOS {tok.eos_ids}, "
                     f"pad {tok.pad_id}) does not fit the model's vocab_size {V}")
        heldout = []
        if cfg.eval_every:
            try:
                heldout = heldout_examples(task, cfg.eval_prompts, eval_task=eval_task)
            except ValueError as e:  # a small file whose hash split left no row for evaluation
                print(f"warning: no held-out evaluation ({e}); pass --eval-task jsonl:FILE")
        return Policy(model, make_rollout_engine(cfg, plain or model), plain, task, tok.eos_ids, tok.pad_id, heldout,
                      None)
    task = make_task(cfg.task)
    model_cfg = preset_config(cfg.preset, task, dense=cfg.dense)
    check_fits([task], model_cfg, cfg.max_new_tokens)  # before the warm-up caches weights for it
    model, warm_path = warmed_up_model(model_cfg, task, cfg.task, steps=cfg.warmup_steps, seed=cfg.model_seed,
                                       until=cfg.warmup_until)
    heldout = heldout_examples(task, cfg.eval_prompts) if cfg.eval_every else []
    return Policy(model, make_rollout_engine(cfg, model), None, task, (EOS,), PAD, heldout, warm_path)


def check_fits(tasks: list, model_cfg, max_new_tokens: int | None) -> None:
    for task in tasks:
        if task is not None:
            try:
                task.check_lengths(model_cfg.max_position_embeddings, max_new_tokens)
            except ValueError as e:
                sys.exit(f"error: {e}")


def make_rollout_engine(cfg: TrainConfig, model):
    """The in-process engine (a cast copy of `model`), or a client of an SGLang / vLLM server (`--engine`)."""
    if cfg.engine == "local":
        return Engine(model, cfg.rollout_dtype, router_levels=cfg.router_levels)
    extra = dict(reload_method=cfg.vllm_reload_method) if cfg.engine.startswith("vllm:") else {}
    return make_engine(cfg.engine, model.cfg, wait=cfg.engine_wait, timeout=cfg.engine_timeout,
                       weights_dir=cfg.weights_dir or os.path.join(cfg.out_dir(), "engine_weights"),
                       weights_dtype=torch.float32 if cfg.rollout_dtype == "fp32" else torch.bfloat16,
                       sync_check=cfg.sync_check, require_routes=cfg.replay == "r3", **extra)


def read_disk_rollouts(cfg: TrainConfig, p: Policy, num_shards: int, lead: bool) -> list | None:
    """--rollouts: every batch, validated against the model before any work (a run that refuses to start beats
    one that silently trains without replay): every step folder whole (`load_rollouts`), sampled at --temperature by
    the model this run starts from (meta.model_digest, unless --allow-other-model), cut into the --shards data shards
    and into --mini-steps minibatches."""
    if not cfg.rollouts:
        return None
    disk = load_rollouts(cfg.rollouts, p.model.cfg, require_routes=cfg.replay == "r3")
    for b in disk:  # π_old must be scored on the engine's scale, or kl and the IS weights are silently wrong
        if abs(float(b.meta.get("temperature", 1.0)) - cfg.temperature) > 1e-9:
            sys.exit(f"error: {b.meta['source']} was sampled at temperature {b.meta.get('temperature')}, but "
                     f"--temperature is {cfg.temperature}: pass the rollout's temperature")
        try:
            check_shardable(b, num_shards, b.meta["source"])
        except ValueError as e:
            sys.exit(f"error: {e}")
        check_mini_steps(cfg.mini_steps, len(b) // num_shards, b.meta["source"], lead)
    recorded = [b for b in disk if b.meta.get("model_digest")]
    mine = model_digest(p.plain if p.plain is not None else p.model) if recorded else None
    other = [b for b in recorded if b.meta["model_digest"] != mine]
    if other:
        b = other[0]
        what = (f"{b.meta['source']} was sampled by another model ({b.meta.get('model', 'meta.model_digest')}; "
                f"{len(other)} of {len(disk)} batches) than the one this run starts from")
        if not cfg.allow_other_model:
            sys.exit(f"error: {what}: pass the rollouts' --preset / --model / --task / --warmup-steps / --init-seed, "
                     f"or --allow-other-model if you mean it")
        if lead:
            print(f"warning: {what} (--allow-other-model)")
    if lead:
        if len(recorded) < len(disk):
            print(f"note: {len(disk) - len(recorded)} rollout batch(es) record no model (meta.model_digest), so "
                  f"nothing checks that this model sampled them")
        print(f"training on {len(disk)} rollout batch(es) from {cfg.rollouts}; the engine only serves val/kl")
    return disk


def check_shards(cfg: TrainConfig, world: int) -> int:
    """The step's data shards (`--shards`, default the world size), refused before any model is loaded unless
    every rank gets the same number of them and each holds the same number of prompts."""
    n = cfg.num_shards(world)
    if n % world:
        sys.exit(f"error: --shards {n} is not a multiple of the world size {world}: every rank needs the same number "
                 f"of shards (FSDP forwards are collective)")
    if cfg.prompts_per_step % n:
        sys.exit(f"error: --prompts-per-step {cfg.prompts_per_step} does not split into {n} equal shards (--shards "
                 f"must divide it)")
    return n


def check_mini_steps(k: int, rows: int, what: str, lead: bool) -> None:
    """--mini-steps K beyond the rows of a step's shard is refused; K that torch.chunk (in `update`) cuts into fewer
    minibatches (6 rows, K = 4: 3 of 2 rows) gets a one-line note."""
    if k > rows:
        sys.exit(f"error: --mini-steps {k} is more than the {rows} rows of {what} (per data shard): each minibatch "
                 f"needs a row; pass --mini-steps {rows} or fewer, or more rows")
    chunks = math.ceil(rows / math.ceil(rows / k))
    if chunks != k and lead:
        print(f"note: --mini-steps {k} on {rows} rows per shard makes {chunks} minibatches of "
              f"{math.ceil(rows / k)} rows (torch.chunk)")


# run-defining fields added after runs were saved without them; their default is what those runs did
NEWER_FIELDS = ("warmup_until", "router_levels", "rollout_lag")


def check_launch(cfg: TrainConfig) -> str:
    """Refusals that need no model (every rank decides the same), a resume's changed run-defining flags among them;
    returns the run folder."""
    if "RANK" in os.environ and not cfg.model:
        sys.exit("error: under torchrun, pass --model PATH (FSDP runs start from an HF checkpoint; the toy presets "
                 "run in one process)")
    if "RANK" in os.environ and cfg.resume:
        sys.exit("error: --resume is not supported under torchrun: FSDP runs save model weights only (OUT/hf), not "
                 "the optimizer and RNG state a bit-identical resume needs. Start a new run with --model OUT/hf")
    if cfg.rollouts:
        rollout_folders(cfg.rollouts, notes=False)  # a missing folder or a gap in its steps: before the warm-up
    out = cfg.out_dir()
    check_output_folder(out, "--out")
    if os.path.exists(os.path.join(out, "metrics.jsonl")) and not (cfg.resume or cfg.overwrite):
        sys.exit(f"error: {out} already holds a run; pass --resume to continue it or --overwrite to replace it")
    if cfg.resume and os.path.exists(os.path.join(out, "ckpt.pt")):
        try:  # changed run-defining flags: refused before the warm-up builds anything (resume() checks again)
            resume_changes(cfg, out)
        except (OSError, ValueError) as e:
            sys.exit(f"error: cannot resume {out}: {e}")
    return out


def resume_changes(cfg: TrainConfig, out: str) -> dict:
    """The changes to run-defining flags since OUT/args.json that --allow-change allows; any other is refused
    (RunFolderError naming each)."""
    with open(os.path.join(out, "args.json")) as f:
        saved = json.load(f)
    saved = {**{f.name: f.default for f in fields(TrainConfig) if f.name in NEWER_FIELDS}, **saved}  # the default
    return check_resume(saved, asdict(cfg), RUN_DEFINING, allow=set(cfg.allowed_changes()))
