"""GRPO with Rollout Routing Replay (R3) on a toy task, or on a real Qwen3-MoE.  `python train.py --r3`

Every step runs these phases, each a function, in this order:
  collect              draw prompts; the engine (its own copy of the weights at --rollout-dtype) samples G
                       responses each and records the experts it routed every token to; rewards → advantages
  old_policy           the fp32 trainer re-scores the samples without grad: π_old, the routes the update will
                       replay, and the train/inference mismatch (kl, F(2), router flips)        (r3/train/score.py);
                       on the steps that log the mismatch (--mismatch-every), and on every step whose update reads
                       it (R2's routes, the trainer's π_old)
  update               --mini-steps optimizer steps; each forward replays the rollout's routes (r3), the routes of
                       the old-policy pass (r2), or lets the router choose (none)              (r3/train/grpo.py)
  sync_engine          weight sync trainer → engine; with --rollout-lag K the engine then holds the weights of K
                       steps earlier (a FIFO of K snapshots, r3/train/lag.py; docs/async.md)
  log_guard_checkpoint one log line and metrics.jsonl, collapse guard, checkpoint

Every flag lives in `r3/train/config.py`. A real model: `--model PATH` (an HF Qwen3-MoE folder with tokenizer.json) with
`--task jsonl:FILE`; under `torchrun --nproc_per_node=N` the trainer is sharded with FSDP2 and each rank samples its
own data shards (`--shards`); rank 0 alone writes files. `--dry-run` prints the per-GPU memory plan and exits.
What is loaded before step 0 (policy, engine, task, disk rollouts), and checked, is in `r3/train/launch.py`.
"""
import copy
import math
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from r3.runs.checkpoint import load_checkpoint, save_checkpoint
from r3.train.collect import (Rollout, advantages, my_shards, sample_shard, shard_generator_name, shard_rows,
                              shard_seed)
from r3.train.config import TrainConfig, parse
from r3.rollout.engine import Engine
from r3.errors import Stopped, WriteError, run_main
from r3.train.evaluate import evaluate
from r3.train.fidelity import gradient_fidelity
from r3.scale.fsdp import (FSDP_PARAM_DTYPES, clip_grad_norm, global_max, global_mean, global_sum,
                           save_hf_checkpoint, setup_distributed, sync_engine)
from r3.train.grpo import MAX_METRICS, loss_denominator, policy_loss
from r3.train.guard import CollapseGuard
from r3.train.lag import WeightLag, lagged_sync, resumed_lag
from r3.scale.hf import load_config
from r3.tools.inspect import dump_samples
from r3.train.launch import (check_launch, check_mini_steps, check_shards, load_policy_and_task, read_disk_rollouts,
                             resume_changes)
from r3.runs.io import atomic_write_json, read_jsonl
from r3.scale.memory import format_plan, memory_plan
from r3.train.metrics import MISMATCH_KEYS, flip_stats, kl_k3
from r3.runs.plots import log_scalars, tensorboard_writer
from r3.runs.process import configure_cpu
from r3.runs.provenance import earlier_segments, git_state, stamp
from r3.runs.interrupt import Interrupts, go_on, hard_stop_line, stopped_line
from r3.runs.runfolder import (RunFolder, RunFolderError, append_metrics, check_steps, read_metrics,
                               remove_snapshots, snapshot_steps, snapshots_to_keep,
                               truncate_metrics)
from r3.train.score import (OldPolicy, batch_groups, forward, old_policy_pass, token_logp, update_reads_pass,
                            without_pass)
from r3.tasks.tasks import make_task
from r3.train.warmup import preset_config, warmup_info


def main(argv=None):
    cfg = parse(TrainConfig, argv, __doc__)
    if cfg.dry_run:
        return dry_run(cfg)
    run, start = setup(cfg)
    stopped_on, step = None, start
    bar = tqdm(range(start, cfg.steps), desc=f"{cfg.mode}/{cfg.rollout_dtype}", initial=start, total=cfg.steps,
               disable=not run.lead)
    # a signal ends the run at the next step boundary, a second one at once (r3/runs/interrupt.py)
    stops = Interrupts(lead=run.lead, hard_stop=lambda signum: hard_stop_line(signum, run.out, run.world > 1))
    try:
        for step in bar:
            t0 = time.perf_counter()
            measure = step % cfg.mismatch_every == 0  # this step logs the mismatch and the staleness flip rate
            rollouts = collect(run, step, measure)
            olds = [old_policy(run, r.batch, measure) for r in rollouts]
            dump(run, rollouts, step)
            fid = fidelity(run, step)  # before the update: the gradients at the weights that sampled this step
            mini_steps = update(run, rollouts, olds, step, measure)
            lag = {} if run.lag is None else {"staleness/rollout_lag": run.lag.lag(step)}  # of the sampling weights
            lagged_sync(run.model, run.engine, run.plain, run.lag, step)  # a server checks what it serves; a lag: K old
            m = dict(step_metrics(run, rollouts, olds, mini_steps, step), **fid, **sync_metrics(run.engine), **lag)
            stopped_on = log_guard_checkpoint(run, m, step, t0, bar, stops)
            if stopped_on or run.stopping:
                break
    except WriteError as e:  # a file of the run could not be written: the message says what is kept; how to go on
        raise WriteError(e.errno, f"{e.strerror}; {go_on(run.out, run.world > 1)}") from e
    finally:
        bar.close()
        stops.restore()
    finish(run, stopped_on)
    if run.stopping:
        raise Stopped(stopped_line(run.stopping, run.out, run.world > 1, step + 1) if run.lead else "",
                      128 + run.stopping)
    return run.out


@dataclass
class Run:
    """What the phases share, built once by `setup`."""
    cfg: TrainConfig
    out: str
    model: torch.nn.Module          # the trainer (FSDP2-sharded under torchrun)
    engine: object                  # the rollout engine: in-process (`Engine`) or a server (`r3.rollout.remote`)
    plain: torch.nn.Module | None   # under torchrun, the full copy that feeds the engine
    task: object
    eos_ids: tuple[int, ...]
    pad_id: int
    opt: torch.optim.Optimizer
    gens: dict                      # "data" (prompts, minibatch orders) and one sampling generator per data shard
    guard: CollapseGuard
    disk: list | None               # --rollouts: batches read from disk, cycled
    chunk: int                      # log-prob chunk (0 = full logits)
    max_new: int
    num_shards: int
    mine: list[int]                 # this rank's data shards
    world: int
    device: torch.device
    lead: bool                      # rank 0: prints and writes files
    val_examples: list              # val/kl prompts
    heldout: list                   # eval/accuracy prompts: the task's held-out split, never drawn for training
    save_dtype: torch.dtype | None
    folder: RunFolder | None        # rank 0: OUT, locked for the life of the process
    tb: object | None = None        # --tensorboard writer
    oracle: Engine | None = None    # --fidelity-every: an fp32 engine, the on-policy reference
    trainer_engine: Engine | None = None  # --eval-trainer: an fp32 engine of the trainer's weights
    examples: list | None = None    # the step's prompts (kept by `collect` for `fidelity`)
    step_start: dict | None = None  # --on-collapse stop, one process: the state the current step started from
    snapshots: list | None = None   # the steps of the guard's snapshots in OUT (collapse_stepN)
    stopping: int = 0               # a signal's number: the run stops after this step (every rank agrees)
    t0: float = 0.0
    prov: dict | None = None        # rank 0: the provenance stamped at the start (r3/runs/provenance.py)
    lag: WeightLag | None = None    # --rollout-lag K >= 1: the FIFO of the engine's last K weights (r3/train/lag.py)

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)


# ---------------------------------------------------------------------------------------------------- the phases
def collect(run: Run, step: int, measure: bool = True) -> list[Rollout]:
    """This rank's data shards of the step: sampled by the engine (or read from disk), rewarded, with advantages.
    measure: keep the engine's full log-softmax for kl_full (small vocabularies only)."""
    cfg = run.cfg
    if run.disk is not None:  # rewards come with the rollouts
        batch = run.disk[step % len(run.disk)]
        return [advantages(shard_rows(batch, s, run.num_shards), None, loss=cfg.loss) for s in run.mine]
    examples = run.task.sample(cfg.prompts_per_step, run.gens["data"], split="train")  # the same on every rank
    run.examples = examples
    return [advantages(*sample_shard(run.engine, run.task, examples, shard=s, num_shards=run.num_shards,
                                     generator=run.gens[shard_generator_name(s)], group_size=cfg.group_size,
                                     temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=run.max_new,
                                     eos_ids=run.eos_ids, pad_id=run.pad_id,
                                     keep_logp_V=measure and run.chunk == 0),
                       loss=cfg.loss) for s in run.mine]


def old_policy(run: Run, batch, measure: bool) -> OldPolicy:
    """The old-policy pass (r3/train/score.py) when the update reads it or the step measures the mismatch; otherwise
    only the routes the update replays (R3: the engine's), no forward. Either way the update computes the same thing."""
    cfg = run.cfg
    if not (measure or update_reads_pass(cfg.replay, cfg.old_logp)):
        return without_pass(batch, cfg.replay)
    return old_policy_pass(run.model, batch, replay=cfg.replay, temperature=cfg.temperature, chunk=run.chunk,
                           measure=measure, share_prompts=not cfg.model)


def groups(run: Run, batch, rows=None):
    """What the trainer's forward shares prompts by (r3/train/score.py `forward`), or None for a real model: FSDP2
    blocks take only the plain forward, and a one-process run of the same model takes it too, so the two match."""
    return None if run.cfg.model else batch_groups(batch, rows)


def update(run: Run, rollouts: list[Rollout], olds: list[OldPolicy], step: int,
           measure: bool = False) -> list[tuple[float, float, dict]]:
    """--mini-steps optimizer steps; minibatch k takes the same rows of every shard. Returns (loss, grad norm,
    loss metrics) per mini-step. measure: mini-steps k >= 1 also log the staleness flip rate."""
    cfg = run.cfg
    for group in run.opt.param_groups:
        group["lr"] = cfg.lr * min(1.0, (step + 1) / max(1, cfg.lr_warmup))
    orders = [torch.randperm(len(rollouts[0].batch), generator=run.gens["data"]).chunk(cfg.mini_steps)
              for _ in range(run.num_shards)]  # every rank draws all shards' orders: `data` stays in step
    return [mini_step(run, [(r, o, orders[s][k]) for s, r, o in zip(run.mine, rollouts, olds)],
                      staleness=measure and k > 0) for k in range(len(orders[0]))]


def mini_step(run: Run, picked: list[tuple[Rollout, OldPolicy, torch.Tensor]],
              staleness: bool = False) -> tuple[float, float, dict]:
    """One optimizer step on the rows `picked` from each shard; one loss normalisation over the whole step.
    staleness: also log staleness/router_flip_rate, the trainer's own routes (a normal forward) at this mini-step's
    weights against the old-policy pass's on the same rows: how far routing drifted since the batch was scored."""
    cfg, model = run.cfg, run.model
    kw = dict(loss=cfg.loss, is_correction=cfg.is_correction, is_cap=cfg.is_cap, max_len=run.max_new)
    dens = [loss_denominator(o.pi_old(r.batch, cfg.old_logp)[rows], r.batch.rollout_logp[rows],
                             r.batch.loss_mask[rows], **kw) for r, o, rows in picked]
    denominator = None if run.num_shards == 1 else max(1.0, global_sum(sum(dens)))
    run.opt.zero_grad(set_to_none=True)
    loss_sum, parts = 0.0, []
    for (r, o, rows), d in zip(picked, dens):
        b = r.batch
        replay = None if o.routes is None else o.routes[rows]  # R3: the engine's routes; R2: π_old's; none
        out = token_logp(model, b.tokens[rows], b.attn_mask[rows], replay, temperature=cfg.temperature,
                         chunk=run.chunk, groups=groups(run, b, rows))
        loss, lm = policy_loss(out.logp, o.pi_old(b, cfg.old_logp)[rows], r.adv[rows], b.loss_mask[rows],
                               clip_low=cfg.clip_range[0], clip_high=cfg.clip_range[1],
                               rollout_logp_BT=b.rollout_logp[rows], denominator=denominator, **kw)
        if staleness and o.own_routes is not None:
            lm["staleness/router_flip_rate"] = drift(model, b, rows, out.routes if replay is None else None,
                                                     o.own_routes[rows], groups(run, b, rows))
        (loss * run.world if run.world > 1 else loss).backward()  # FSDP averages grads over ranks: ×world = sum
        loss_sum += float(loss.detach())
        parts.append((lm, d))
    loss_value = global_sum(loss_sum)
    grad_norm = clip_grad_norm(model.parameters(), cfg.grad_clip)
    if math.isfinite(grad_norm) and math.isfinite(loss_value):
        run.opt.step()  # a non-finite step is skipped (and reported by the guard), never applied
    return loss_value, grad_norm, dict(global_mean(parts, maxima=MAX_METRICS), **{"grpo/loss": loss_value})


@torch.no_grad()
def drift(model, batch, rows, own_now, own_old, shared) -> float:
    """Router flip rate between the trainer's own routes now (`own_now`, or a normal forward when the update
    replayed routes) and at the old-policy pass, over the response tokens of `rows`."""
    if own_now is None:
        own_now = forward(model, batch.tokens[rows][:, :-1], batch.attn_mask[rows][:, :-1], None, shared,
                          return_hidden=True)[1]
    return flip_stats(own_now, own_old, batch.loss_mask[rows])["router_flip_rate"]


def fidelity(run: Run, step: int) -> dict:
    """Every --fidelity-every steps: the arm's gradient vs the on-policy (fp32-engine) one, r3/train/fidelity.py. Its
    own generator; no gradient, weight or RNG stream of training is changed."""
    cfg = run.cfg
    if not cfg.fidelity_every or step % cfg.fidelity_every:
        return {}
    sample_kw = dict(max_new_tokens=run.max_new, eos_ids=run.eos_ids, pad_id=run.pad_id, group_size=cfg.group_size,
                     temperature=cfg.temperature, top_p=cfg.top_p)
    loss_kw = dict(loss=cfg.loss, clip_low=cfg.clip_range[0], clip_high=cfg.clip_range[1],
                   is_correction=cfg.is_correction, is_cap=cfg.is_cap, max_len=run.max_new)
    return gradient_fidelity(run.model, run.engine, run.oracle, run.task, run.examples, replay=cfg.replay,
                             seed=2_000_003 * cfg.seed + step + 1, sample_kw=sample_kw, loss_kw=loss_kw,
                             chunk=run.chunk, old_logp=cfg.old_logp)


def dump(run: Run, rollouts: list[Rollout], step: int) -> None:
    """Every --dump-every steps, a few rows scored by the weights that sampled them (before the update): what
    `python -m r3.inspect OUT` shows. One process only (the scoring forward is not sharded)."""
    if run.cfg.dump_every and step % run.cfg.dump_every == 0 and run.world == 1:
        dump_samples(run.path(f"samples/step{step}"), rollouts[0].batch, run.model, temperature=run.cfg.temperature)


def step_metrics(run: Run, rollouts: list[Rollout], olds: list[OldPolicy], mini_steps: list, step: int) -> dict:
    """The step's numbers, reduced over shards and ranks: token metrics weigh by tokens, row metrics by rows."""
    eos = torch.tensor(run.eos_ids)
    tok = global_mean([(o.metrics, float(r.batch.loss_mask.sum())) for r, o in zip(rollouts, olds)]) \
        if olds[0].metrics else {}
    rows = global_mean([(row_metrics(r, eos, run.max_new), len(r.batch)) for r in rollouts])
    groups = global_mean([(r.adv_metrics, len(r.batch.group.unique())) for r in rollouts])
    losses, grad_norms, lms = zip(*mini_steps)
    mean = lambda k: sum(x[k] for x in lms) / len(lms)  # noqa: E731
    stale = [x["staleness/router_flip_rate"] for x in lms if x.get("staleness/router_flip_rate") is not None]
    return dict(step=step, reward=rows["reward"], **{**dict.fromkeys(MISMATCH_KEYS), **tok},
                response_length=rows["response_length"], exact=rows["exact"], runaway_frac=rows["runaway_frac"],
                loss=sum(losses) / len(losses), grad_norm=math.nan if any(map(math.isnan, grad_norms)) else
                max(grad_norms), clip_frac=mean("grpo/clip_frac"), lr=run.opt.param_groups[0]["lr"], **groups,
                **{k: max(x[k] for x in lms) if k in MAX_METRICS else mean(k) for k in lms[0]
                   if k not in ("grpo/loss", "grpo/clip_frac", "staleness/router_flip_rate")},
                **{"staleness/router_flip_rate": sum(stale) / len(stale) if stale else None})


def sync_metrics(engine) -> dict:
    """A server engine's last weight sync: sync/bytes, write_s, load_s, check_s (the post-sync weight check),
    check_tokens (the probe's, all servers), check_gap (the largest server's mean gap); {} in process."""
    return {f"sync/{k}": v for k, v in (getattr(engine, "last_sync", None) or {}).items()}


def row_metrics(r: Rollout, eos: torch.Tensor, max_new: int) -> dict:
    b = r.batch
    lengths = b.response_mask.sum(1).float()
    ended = (torch.isin(b.tokens, eos.to(b.tokens.device)) & b.response_mask).any(1)
    return dict(reward=float(b.rewards.mean()), response_length=float(lengths.mean()), exact=r.exact,
                runaway_frac=float(((lengths >= max_new) & ~ended).float().mean()))


def log_guard_checkpoint(run: Run, m: dict, step: int, t0: float, bar, stops) -> list[str] | None:
    """val/kl, collapse guard, one line + metrics.jsonl, checkpoints (also when a signal stops the run after this
    step: `run.stopping`). Returns the symptoms that stop the run."""
    cfg = run.cfg
    if cfg.val_every and (step + 1) % cfg.val_every == 0:
        m["val/kl"] = validate(run, step)
    if run.heldout and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps) and run.lead:
        m.update(evaluate(run.engine, run.task, run.heldout, max_new_tokens=run.max_new, eos_ids=run.eos_ids,
                          pad_id=run.pad_id, samples=cfg.eval_samples, temperature=cfg.temperature, top_p=cfg.top_p,
                          generator=torch.Generator(device=run.device).manual_seed(cfg.seed)))
        if cfg.eval_trainer:  # the trainer's weights in fp32: the policy without the engine's numerics
            run.trainer_engine = run.trainer_engine or Engine(run.model, "fp32")
            run.trainer_engine.sync(run.model)
            m["eval/accuracy_greedy_trainer"] = evaluate(
                run.trainer_engine, run.task, run.heldout, max_new_tokens=run.max_new, eos_ids=run.eos_ids,
                pad_id=run.pad_id, samples=0)["eval/accuracy_greedy"]
    m["symptoms"] = run.guard.check(m)
    m["step_time"] = time.perf_counter() - t0
    if run.lead:
        append_metrics(run.path("metrics.jsonl"), m)
        if run.tb is not None:
            log_scalars(run.tb, m)
        bar.set_postfix(reward=f"{m['reward']:.3f}", kl="-" if m["kl"] is None else f"{m['kl']:.1e}")
        if not cfg.quiet:
            tqdm.write(log_line(m))
    if run.guard.new:  # a symptom's onset: keep the weights it produced, for inspection, under their own name
        kept = snapshot(run, step)
        if run.lead:
            tqdm.write(f"collapse guard: {', '.join(run.guard.new)} at step {step}; {kept}")
        if cfg.on_collapse == "stop":
            keep_pre_onset(run, step)
            return run.guard.new
    run.stopping = stops.agreed(global_max) if step + 1 < cfg.steps else 0  # the same step on every rank
    if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps or run.stopping:
        save(run, step + 1)
    run.step_start = step_start_state(run)  # the next step starts from here
    return None


def snapshot(run: Run, step: int) -> str:
    """Save the state after `step` as collapse_stepN (.pt; a folder with --model), for inspection. --guard-snapshots
    N keeps the first and the latest N - 1: older ones are removed once the new one is written."""
    keep = snapshots_to_keep(run.snapshots + [step], run.cfg.guard_snapshots)
    if step not in keep:
        return f"no snapshot saved (--guard-snapshots {run.cfg.guard_snapshots})"
    name = f"collapse_step{step}"
    try:
        save(run, step + 1, name)
    except ValueError as e:  # save_checkpoint refuses non-finite weights
        return f"the collapsed state is not saved: {e}"
    gone = [s for s in run.snapshots if s not in keep]
    if run.lead:
        remove_snapshots(run.out, gone)
    run.snapshots = keep
    return f"the collapsed state is in {run.path(name + '.pt' if run.world == 1 else name)}" + (
        f" (--guard-snapshots {run.cfg.guard_snapshots}: removed {', '.join(f'collapse_step{s}' for s in gone)})"
        if gone else "")


@torch.no_grad()
def step_start_state(run: Run) -> dict | None:
    """--on-collapse stop, one process: a copy of the state the next step starts from (model, optimizer, RNG
    streams, guard), for `keep_pre_onset`. The tensors are copied into the buffers of the previous copy (fresh
    allocations each step cost 5-10x more); the engine's weights are a cast of the model's, so they are not copied
    (with --rollout-lag, references to the FIFO's snapshots, which are never written to).
    Under FSDP no copy is held (a second copy of a sharded model and its optimizer state would not fit)."""
    if run.cfg.on_collapse != "stop" or run.world > 1:
        return None
    model, opt = run.model.state_dict(), run.opt.state_dict()  # references to the live tensors
    live = list(model.values()) + [v for s in opt["state"].values() for v in s.values() if torch.is_tensor(v)]
    keep = run.step_start
    if keep is None or [(t.shape, t.dtype) for t in keep["tensors"]] != [(t.shape, t.dtype) for t in live]:
        keep = dict(tensors=[t.detach().clone() for t in live])  # the first step, or Adam's state just appeared
    else:
        for copy_, t in zip(keep["tensors"], live):
            copy_.copy_(t)
    it = iter(keep["tensors"])
    keep["model"] = {k: next(it) for k in model}
    opt["state"] = {i: {k: next(it) if torch.is_tensor(v) else v for k, v in s.items()}
                    for i, s in opt["state"].items()}
    keep.update(opt=dict(opt, param_groups=copy.deepcopy(opt["param_groups"])),
                rng={k: g.get_state() for k, g in run.gens.items()}, guard=copy.deepcopy(run.guard.state_dict()),
                lag=run.lag and run.lag.references())
    return keep


def keep_pre_onset(run: Run, step: int) -> None:
    """The guard stops the run at `step`: put back the state that step started from and save it as ckpt.pt (and
    OUT/hf), so that --resume continues from before the onset, never from the collapsed state. The finite mini-steps
    of `step` were applied, so the state after it is not pre-onset. Under FSDP, OUT/hf keeps its last periodic save."""
    s = run.step_start
    if s is None:
        return
    run.model.load_state_dict(s["model"])
    run.opt.load_state_dict(s["opt"])
    for k, g in run.gens.items():
        g.set_state(s["rng"][k])
    run.guard.load_state_dict(s["guard"])
    if run.lag is not None:  # the engine served past weights at that step's start
        run.lag.restore(s["lag"], run.engine)
    elif run.cfg.engine == "local":
        sync_engine(run.model, run.engine, run.plain)
    save(run, step)
    if run.lead:
        tqdm.write(f"collapse guard: {run.path('ckpt.pt')} holds the state step {step} started from; --resume "
                   f"continues from there")


def log_line(m: dict) -> str:
    f = lambda k, spec: "-" if m[k] is None else format(m[k], spec)  # noqa: E731  (None: not measured this step)
    exact = "-" if m["exact"] is None else f"{m['exact']:.2f}"
    held = f" | held-out acc {m['eval/accuracy']:.3f} (greedy {m['eval/accuracy_greedy']:.3f})" \
        if m.get("eval/accuracy") is not None else ""
    return (f"step {m['step']:4d} | reward {m['reward']:.3f} | exact {exact} | kl {f('kl', '.2e')} | "
            f"F(2) {f('extreme_frac', '.2%')} | flips {f('router_flip_rate', '.2%')} | gn {m['grad_norm']:.2f} | "
            f"len {m['response_length']:.1f} | ent {f('entropy', '.3f')} | {m['step_time']:.2f}s{held}")


@torch.no_grad()
def validate(run: Run, step: int) -> float | None:
    """val/kl: k3 KL between the normal and the R3-replayed train forward on fresh held-out rollouts."""
    model, cfg = run.model, run.cfg
    if model.cfg.dense:
        return None
    g = torch.Generator(device=run.device).manual_seed(cfg.seed * 1_000_003 + step)
    b = run.engine.generate([e.prompt for e in run.val_examples], max_new_tokens=run.max_new, eos_ids=run.eos_ids,
                            pad_id=run.pad_id, group_size=2, temperature=cfg.temperature, top_p=cfg.top_p,
                            generator=g)
    if b.routes is None:  # a server that sends no routes: nothing to replay
        return None
    kw = dict(temperature=cfg.temperature, chunk=run.chunk, groups=groups(run, b))
    normal = token_logp(model, b.tokens, b.attn_mask, None, **kw).logp
    replay = token_logp(model, b.tokens, b.attn_mask, b.routes, **kw).logp
    return kl_k3(normal, replay, b.loss_mask)


def save(run: Run, step_done: int, name: str | None = None) -> None:
    """One process: ckpt.pt (resumable), plus OUT/hf with --model. FSDP: OUT/hf only (every rank calls)."""
    if run.world == 1:
        save_checkpoint(run.path(name + ".pt" if name else "ckpt.pt"), model=run.model, optimizer=run.opt,
                        engine=run.engine if run.cfg.engine == "local" else None, generators=run.gens, step=step_done,
                        extra=dict(guard=run.guard.state_dict(), **({} if run.lag is None else
                                                                     dict(rollout_lag=run.lag.state_dict()))))
    if run.cfg.model:
        save_hf_checkpoint(run.model, run.path(name or "hf"), dtype=run.save_dtype)


# --------------------------------------------------------------------------------------------------------- set-up
def setup(cfg: TrainConfig) -> tuple[Run, int]:
    """Load the model, engine, task and optimizer; open (or resume) the run folder. Returns (run, first step).
    Every refusal comes before OUT is created or written (a resume's, before anything in OUT changes)."""
    t0 = time.time()
    code = git_state()  # the checkout as this process imports it (the warm-up below can take minutes)
    out = check_launch(cfg)
    torch.manual_seed(cfg.seed)
    configure_cpu(cfg.threads)
    rank, world, device = setup_distributed() if cfg.model else (0, 1, torch.device("cpu"))
    num_shards = check_shards(cfg, world)  # before the model loads (at 30B, minutes)
    if not cfg.rollouts:
        check_mini_steps(cfg.mini_steps, cfg.prompts_per_step * cfg.group_size // num_shards, "a step", rank == 0)
    p = load_policy_and_task(cfg, world, device)
    disk = read_disk_rollouts(cfg, p, num_shards, rank == 0)
    folder = open_folder(cfg, out) if rank == 0 else None
    mine = my_shards(num_shards, rank, world)
    gens = dict(data=torch.Generator().manual_seed(cfg.seed))  # the same on every rank: it draws every prompt
    for s in mine:
        gens[shard_generator_name(s)] = torch.Generator(device=device).manual_seed(shard_seed(cfg.seed, s))
    run = Run(cfg=cfg, out=out, model=p.model, engine=p.engine, plain=p.plain, task=p.task, eos_ids=p.eos_ids,
              pad_id=p.pad_id, opt=torch.optim.AdamW(p.model.parameters(), lr=cfg.lr, betas=(0.9, 0.99),
                                                     weight_decay=0.0),
              gens=gens, guard=CollapseGuard(reward_drop=cfg.guard_reward_drop, kl_max=cfg.guard_kl_max),
              disk=disk,
              chunk=cfg.chunk_for(p.model.cfg.vocab_size),
              max_new=cfg.max_new_tokens or p.task.max_new_tokens, num_shards=num_shards, mine=mine, world=world,
              device=device, lead=rank == 0,
              val_examples=p.task.sample(cfg.val_prompts, torch.Generator().manual_seed(10_000 + cfg.seed)),
              heldout=p.heldout, save_dtype=load_config(cfg.model)[1] if cfg.model else None, folder=folder, t0=t0,
              tb=tensorboard_writer(os.path.join(out, "tb")) if cfg.tensorboard and rank == 0 else None)
    if cfg.fidelity_every:
        run.oracle = Engine(p.model, "fp32")
    run.snapshots = snapshot_steps(out) if world == 1 else []  # (a torchrun run never resumes: none on any rank)
    run.lag = WeightLag(cfg.rollout_lag, p.engine) if cfg.rollout_lag else None
    try:
        start = resume(run) if cfg.resume else 0
    except BaseException:
        folder and folder.release()
        raise
    run.step_start = step_start_state(run)
    if cfg.engine != "local":  # the server starts from whatever it loaded: give it the trainer's weights
        run.engine.sync(run.model)
    if run.lead:
        # provenance: code (as imported), torch, machine, command line, and after a resume the earlier processes'
        # commits; rewritten at the end with the wall time
        run.prov = stamp(out, git=code, segments=earlier_segments(out) if start else None)
        if start == 0:
            open(run.path("metrics.jsonl"), "w").close()
            atomic_write_json(run.path("args.json"), asdict(cfg))
            atomic_write_json(run.path("run.json"), dict(model=asdict(p.model.cfg), world_size=world,
                                                         warmup_checkpoint=p.warm_path,
                                                         warmup=warmup_info(p.warm_path) if p.warm_path else None))
    return run, start


def open_folder(cfg: TrainConfig, out: str) -> RunFolder:
    """Lock OUT for this process; --overwrite removes everything the old run wrote before anything new is written."""
    try:
        folder = RunFolder(out)
    except RunFolderError as e:
        sys.exit(f"error: {e}")
    if cfg.overwrite and folder.has_run():
        folder.clear()
    return folder


def resume(run: Run) -> int:
    """Restore OUT/ckpt.pt if there is one, after checking the run-defining flags match the saved run (or are
    allowed to change); drop metrics lines logged after the checkpoint (they are recomputed identically)."""
    ckpt = run.path("ckpt.pt")
    if not os.path.exists(ckpt):
        print(f"no checkpoint in {run.out}; starting from scratch")
        return 0
    try:
        changes = resume_changes(run.cfg, run.out)
        start, extra = load_checkpoint(ckpt, model=run.model, optimizer=run.opt, generators=run.gens,
                                       engine=run.engine if run.cfg.engine == "local" else None)
        run.lag = resumed_lag(run.lag, extra.get("rollout_lag"), k=run.cfg.rollout_lag, model=run.model,
                              engine=run.engine, plain=run.plain, changed="rollout_lag" in changes, step=start,
                              path=ckpt)
        kept = check_steps([r for r in read_metrics(run.path("metrics.jsonl")) if r["step"] < start])
    except (OSError, ValueError, RuntimeError) as e:
        sys.exit(f"error: cannot resume {run.out}: {e}")
    if kept != start:
        sys.exit(f"error: cannot resume {run.out}: metrics.jsonl holds steps 0..{kept - 1} but ckpt.pt is at step "
                 f"{start}; those lines are lost, so the run would not be whole")
    truncate_metrics(run.path("metrics.jsonl"), start)  # only now: a refused resume leaves the log as it was
    run.guard.load_state_dict(extra["guard"])
    if changes:
        run.folder.record_resume(start, changes)
        atomic_write_json(run.path("args.json"), asdict(run.cfg))
        print(f"resuming with changed {', '.join(f'{k}: {a} -> {b}' for k, (a, b) in changes.items())} "
              f"(recorded in resumes.jsonl)")
    print(f"resumed {run.out} at step {start}")
    return start


def finish(run: Run, stopped_on: list[str] | None) -> None:
    """done.json (not when a signal stopped the run: it has steps to go), the plot, the provenance's end stamp."""
    if run.lead:
        if not run.stopping:
            atomic_write_json(run.path("done.json"), dict(steps=len(read_jsonl(run.path("metrics.jsonl"))),
                                                          stopped_on=stopped_on, world_size=run.world), indent=None)
        if not run.cfg.no_plot and not run.stopping:
            from r3.runs.plots import plot_run
            plot_run(read_jsonl(run.path("metrics.jsonl")), run.path("metrics.png"), title=run.out)
            print(f"wrote {run.path('metrics.png')}")
        stamp(run.out, t0=run.t0, git=run.prov, segments=run.prov.get("segments"))
        if run.tb is not None:
            run.tb.close()
        run.folder.release()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def dry_run(cfg: TrainConfig) -> None:
    """Print `memory_plan` for --model's config.json (no weights read) or --preset, at the torchrun world size."""
    env_world = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else None
    if env_world and cfg.world_size and env_world != cfg.world_size:
        sys.exit(f"error: --world-size {cfg.world_size} disagrees with torchrun's WORLD_SIZE {env_world}")
    world = env_world or cfg.world_size or 1
    num_shards = check_shards(cfg, world)  # the plan is of a launch that train.py would accept
    check_mini_steps(cfg.mini_steps, cfg.prompts_per_step * cfg.group_size // num_shards, "a step", lead=False)
    if cfg.model:  # (--dense with --model is refused by the config)
        model_cfg = load_config(cfg.model)[0]
    else:  # a jsonl task has no toy vocabulary to widen the preset to
        model_cfg = preset_config(cfg.preset, None if cfg.task.startswith("jsonl:") else make_task(cfg.task),
                                  dense=cfg.dense)
    rows = math.ceil(cfg.prompts_per_step * cfg.group_size / num_shards / cfg.mini_steps)
    plan = memory_plan(model_cfg, world, param_dtype=FSDP_PARAM_DTYPES[cfg.fsdp_param_dtype],
                       seq_len=cfg.plan_seq_len, micro_batch=rows, vocab_chunk=cfg.logprob_chunk or 1024,
                       activation_checkpointing=cfg.activation_checkpointing)
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"dry run: {cfg.model or 'preset ' + cfg.preset}; rows per training forward: {rows} "
              f"(prompts-per-step × group-size / shards / mini-steps; raise --shards to cut it)")
        print(format_plan(plan))


if __name__ == "__main__":
    run_main(main)
