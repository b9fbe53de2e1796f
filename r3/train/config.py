"""Every flag of train.py and rollout.py in one place: a dataclass field each, with its help, choices and domain.

`TrainConfig` (train.py) and `RolloutConfig` (rollout.py) share `SamplingConfig`: the model, the task and how the
engine samples, under the same names in both scripts (`--preset` names a toy preset, `--model` a checkpoint path).
The argparse parser is generated from the fields (`parse`), so a flag, its default, its help and its domain are
written once; `args.json` is `dataclasses.asdict(config)`.

Validation happens before any work: each field's domain (`>= 1`, `> 0`, `in (0, 1]`, finite, ...) and the
cross-field rules in `validate()`. A value outside its domain is refused with a message that states the domain.
Sizes are bounded, so a typo cannot ask for a step that never starts: at most MAX_PROMPTS prompts per step (and
held-out prompts), MAX_GROUP samples per prompt, MAX_ROWS rows (prompts × samples) per step, MAX_THREADS threads.
Derived values (clip range by loss, log-prob chunk by vocabulary, response length by task, shards by world size)
are methods: computed where used, never written back into the config.
"""
import argparse
import math
import typing
from dataclasses import dataclass, field, fields

from r3.rollout.engine import ROLLOUT_DTYPES
from r3.model.model import PRESETS
from r3.train.score import REPLAY_MODES, default_chunk


def _domain(text: str, ok):
    return text, ok


INT_GE0 = _domain(">= 0", lambda v: v >= 0)
INT_GE1 = _domain(">= 1", lambda v: v >= 1)
INT_GE2 = _domain(">= 2", lambda v: v >= 2)
POSITIVE = _domain("> 0 and finite", lambda v: v > 0 and math.isfinite(v))
NONNEG = _domain(">= 0 and finite", lambda v: v >= 0 and math.isfinite(v))
AT_LEAST_1 = _domain(">= 1 and finite", lambda v: v >= 1 and math.isfinite(v))
CLIP_NORM = _domain("> 0 (inf = no clipping)", lambda v: v > 0)
PROB = _domain("in (0, 1]", lambda v: 0 < v <= 1)
MAX_PROMPTS, MAX_GROUP, MAX_ROWS, MAX_THREADS = 1 << 16, 1 << 10, 1 << 20, 1 << 10
PROMPTS = _domain(f"in [1, {MAX_PROMPTS}]", lambda v: 1 <= v <= MAX_PROMPTS)
GROUP = _domain(f"in [1, {MAX_GROUP}]", lambda v: 1 <= v <= MAX_GROUP)
SAMPLES = _domain(f"in [0, {MAX_GROUP}]", lambda v: 0 <= v <= MAX_GROUP)
ROUTER_LEVELS = _domain("odd, in [3, 65535]", lambda v: 3 <= v <= 65535 and v % 2 == 1)
THREADS = _domain(f"in [1, {MAX_THREADS}]", lambda v: 1 <= v <= MAX_THREADS)
PORT = _domain("in [0, 65535] (0 = a free one)", lambda v: 0 <= v <= 65535)


def flag(default, help: str, *, choices=None, domain=None, alias: str | None = None, required: bool = False):
    return field(default=default, metadata=dict(help=help, choices=choices, domain=domain, alias=alias,
                                                required=required))


@dataclass(frozen=True)
class SamplingConfig:
    preset: str = flag("toy", "toy model preset", choices=sorted(PRESETS))
    model: str | None = flag(None, "a checkpoint instead of a preset: an HF Qwen3-MoE folder (config.json, "
                                   "*.safetensors; train.py also needs its tokenizer.json and --task jsonl:FILE); "
                                   "rollout.py also takes a safetensors file written by "
                                   "r3.runs.checkpoint.save_weights")
    dense: bool = flag(False, "the preset's dense twin (matched active parameters, no router, no routes)")
    task: str = flag("cipher", "toy task: cipher | sort | reverse | add, optionally NAME:MIN-MAX (input length); "
                             "or jsonl:FILE")
    warmup_steps: int = flag(80, "supervised warm-up steps for a preset before RL (cached and shared; 0 = random "
                                 "init); with --warmup-until, the most it may take", domain=INT_GE0)
    warmup_until: float | None = flag(None, "start-matched seeds: warm up until the sampled reward on a fixed probe "
                                            "set (r3/train/warmup.py) reaches this, checked every 5 steps, at most "
                                            "--warmup-steps steps; the count is recorded in OUT/run.json",
                                      domain=PROB)
    seed: int = flag(0, "seed of the prompts and of sampling (and of init and warm-up, unless --init-seed)",
                     domain=INT_GE0)
    init_seed: int | None = flag(None, "seed of the preset's init and warm-up (default: --seed)", domain=INT_GE0)
    prompts_per_step: int = flag(16, "prompts per step (rollout.py: prompts in the batch)", domain=PROMPTS,
                                 alias="--num-prompts")
    group_size: int = flag(8, "samples per prompt (the GRPO group size G)", domain=GROUP)
    rollout_dtype: str = flag("bf16", "engine numerics (the trainer is fp32); fp8, fp8-channel, fp8-router, int4, "
                                      "fp4, mxfp4 = simulated low-bit serving weights (r3/model/quant.py)",
                              choices=sorted(ROLLOUT_DTYPES))
    router_levels: int | None = flag(None, "the routing-mismatch dial, engine only: round the engine's router "
                                           "weight per row to the N-point symmetric grid (r3/model/quant.py "
                                           "router_grid; N = 2^B - 1 is int-B: 3 ternary, 7 int3, 15 int4) in place "
                                           "of what --rollout-dtype does to it; the trainer never sees it. An "
                                           "amplifier of the engine's routing mismatch, not a real engine",
                                     domain=ROUTER_LEVELS)
    temperature: float = flag(1.0, "sampling temperature (the trainer scores at the same)", domain=POSITIVE)
    top_p: float = flag(1.0, "nucleus sampling threshold (1 = off)", domain=PROB)
    max_new_tokens: int | None = flag(None, "response length limit (default: the task's; jsonl: 1024)",
                                      domain=INT_GE1)
    threads: int = flag(1, "torch intra-op threads (the toy gains nothing from more; run arms in parallel)",
                        domain=THREADS)

    @property
    def model_seed(self) -> int:
        return self.seed if self.init_seed is None else self.init_seed

    def validate(self) -> None:
        """Cross-field rules; raises ValueError. Field domains are checked by `parse` (and `check_domains`)."""
        if self.model and self.dense:
            raise ValueError("--dense builds the dense twin of a toy preset; a checkpoint has no dense twin")
        if self.router_levels is not None and self.dense:
            raise ValueError("--router-levels rounds the engine's router weight; --dense has no router")
        if self.warmup_until is not None and (self.model or self.warmup_steps == 0):
            raise ValueError("--warmup-until warms a preset up (at most --warmup-steps >= 1 steps); a --model "
                             "checkpoint is not warmed up")
        if self.prompts_per_step * self.group_size > MAX_ROWS:
            raise ValueError(f"--prompts-per-step {self.prompts_per_step} × --group-size {self.group_size} = "
                             f"{self.prompts_per_step * self.group_size} rows per step; at most {MAX_ROWS}")


@dataclass(frozen=True)
class TrainConfig(SamplingConfig):
    replay: str = flag("none", "none: the router picks experts; r3: replay the rollout engine's routes; r2: replay "
                               "the routes of the trainer's own old-policy pass (fixes drift across mini-steps, not "
                               "the engine mismatch). --r3 is short for --replay r3", choices=list(REPLAY_MODES))
    steps: int = flag(200, "RL steps", domain=INT_GE1)
    lr: float = flag(3e-4, "AdamW learning rate", domain=POSITIVE)
    lr_warmup: int = flag(10, "linear learning-rate warm-up steps (fresh Adam state is jumpy)", domain=INT_GE0)
    grad_clip: float = flag(1.0, "max grad norm (the logged grad_norm is the largest pre-clip norm among the "
                                 "step's mini-steps)", domain=CLIP_NORM)
    mini_steps: int = flag(4, "optimizer steps per rollout batch (minibatches); > 1 is off-policy", domain=INT_GE1)
    loss: str = flag("grpo", "policy loss (see r3/train/grpo.py): grpo, dr_grpo, gspo, or seq_is, the untruncated "
                             "sequence-level importance-weighted policy gradient, -sg[w(y)] A sum_t log pi(y_t) with "
                             "w(y) = pi_theta(y) / pi_engine(y), no clipping; --is-correction tis / mis then "
                             "truncate w at C or drop rows outside [1/C, C]",
                     choices=["grpo", "dr_grpo", "gspo", "seq_is"])
    clip_low: float | None = flag(None, "clip ε low (default 0.2; gspo 3e-4)", domain=NONNEG)
    clip_high: float | None = flag(None, "clip ε high (default 0.28; gspo 4e-4)", domain=NONNEG)
    old_logp: str = flag("trainer", "π_old in the PPO ratio: trainer (the fp32 old-policy pass, the default) or "
                                    "engine (the rollout engine's log-probs, as slime can: the ratio then carries the "
                                    "whole train/inference mismatch)", choices=["trainer", "engine"])
    rollout_lag: int = flag(0, "asynchronous RL: the engine samples step t with the trainer's weights from the start "
                               "of step t − K (the first K steps with the initial weights), as a K-step off-policy "
                               "trainer does (verl one-step-off, AReaL, slime async); 0 = synced every step. π_old "
                               "stays the trainer's own log-probs at the weights it updates from (--old-logp "
                               "trainer), the stale engine's kept for --is-correction; --old-logp engine takes the "
                               "stale engine's as π_old (no recompute). Costs K copies of the engine's weights in "
                               "CPU memory and in ckpt.pt; the in-process engine only (docs/async.md)",
                            domain=INT_GE0)
    is_correction: str = flag("none", "rollout-vs-train importance correction (tis truncates at C; icepop/mis "
                                      "mask outside [1/C, C])", choices=["none", "tis", "icepop", "mis"])
    is_cap: float = flag(2.0, "C for --is-correction", domain=AT_LEAST_1)
    eval_every: int = flag(50, "every N steps, and at the end, held-out accuracy (greedy and sampled) and reward on "
                               "--eval-prompts prompts training never draws (0 = never)", domain=INT_GE0)
    eval_prompts: int = flag(256, "held-out prompts (the same set for every seed and arm)", domain=PROMPTS)
    eval_samples: int = flag(4, "sampled responses per held-out prompt (plus one greedy)", domain=SAMPLES)
    eval_trainer: bool = flag(False, "also evaluate the trainer's own greedy accuracy (an fp32 copy of the weights: "
                                     "no rollout numerics, no --router-levels) beside the engine's, as "
                                     "eval/accuracy_greedy_trainer")
    eval_task: str | None = flag(None, "jsonl:FILE of held-out prompts (default: the task's own held-out split)")
    dump_every: int = flag(50, "every N steps write a sample dump, OUT/samples/stepN (a few rows with per-token "
                               "engine vs trainer log-probs and flipped layers; read it with python -m r3.inspect "
                               "OUT; one process only; 0 = never)", domain=INT_GE0)
    tensorboard: bool = flag(False, "also write the metrics as TensorBoard scalars to OUT/tb (needs tensorboard)")
    allow_change: str | None = flag(None, "--resume: comma-separated run-defining fields allowed to differ from the "
                                          "saved run (e.g. lr,grad_clip); the change is recorded in OUT/resumes.jsonl")
    mismatch_every: int = flag(1, "every N steps log the train/inference mismatch (kl, F(2), router flips, entropy) "
                                  "and the staleness flip rate; the old-policy forward that measures them runs on "
                                  "those steps only, unless the update reads it (R2's routes, the trainer's π_old). "
                                  "Changes nothing but what is logged", domain=INT_GE1)
    val_every: int = flag(25, "every N steps log val/kl: normal vs replayed train forward on held-out rollouts "
                              "(0 = never)", domain=INT_GE0)
    val_prompts: int = flag(32, "held-out prompts for val/kl", domain=PROMPTS)
    fidelity_every: int = flag(0, "every N steps log fidelity/cos and fidelity/rel_err: the arm's first-mini-step "
                                  "gradient vs the on-policy gradient from an fp32 engine, same prompts and weights, "
                                  "coupled sampling (r3/train/fidelity.py; changes no other metric; 0 = never)",
                               domain=INT_GE0)
    on_collapse: str = flag("continue", "when the collapse guard fires: save a snapshot (--guard-snapshots), log "
                                        "the symptom, then stop or continue", choices=["stop", "continue"])
    guard_reward_drop: float = flag(0.3, "guard: reward EMA this far below its running peak", domain=POSITIVE)
    guard_kl_max: float = flag(1.0, "guard: mismatch kl above this", domain=POSITIVE)
    guard_snapshots: int = flag(3, "guard: each onset of a symptom saves the state it produced, for inspection "
                                   "(OUT/collapse_stepN.pt, a full checkpoint; a folder with --model); keep the "
                                   "first and the latest N - 1, removing older ones (0 = none). Every onset is "
                                   "still logged (metrics.jsonl 'symptoms'); no number of the run changes",
                                domain=INT_GE0)
    engine: str = flag("local", "where rollouts are sampled: local (the in-process engine at --rollout-dtype) or "
                                "sglang:URL / vllm:URL, a server that returns routes; several servers as "
                                "sglang:URL1,URL2,... share each step's prompts and all load every weight update, "
                                "synced each step through --weights-dir (written in --rollout-dtype: fp32, else "
                                "bf16). Launch recipes: docs/servers.md")
    weights_dir: str | None = flag(None, "with a server engine: a folder the trainer and every server read, where "
                                         "the trainer writes its weights each step (default OUT/engine_weights)")
    engine_wait: float = flag(1800.0, "with a server engine: seconds to wait at start-up for every server to "
                                      "answer /health (refused connections and HTTP 503 are waited out; a 30B load "
                                      "with CUDA-graph capture takes minutes)", domain=NONNEG)
    engine_timeout: float = flag(3600.0, "with a server engine: seconds per request; then the request is aborted "
                                         "on the server (SGLang /abort_request) and sent again, up to 3 retries",
                                 domain=POSITIVE)
    sync_check: str = flag("error", "with a server engine: after every weight sync each server scores a fixed "
                                    "probe and the trainer compares with its own log-probs at the server's precision "
                                    "(r3/rollout/sync_check.py); a server over the tolerance stops the run (error) or "
                                    "is reported (warn). The check is never off", choices=["error", "warn"])
    vllm_reload_method: str = flag("reload_weights", "with a vLLM engine: the worker method /collective_rpc calls "
                                                     "to load each sync; reload_weights_repacked with r3's CPU worker "
                                                     "extension (r3/rollout/vllm_cpu_reload.py: vLLM 0.32's CPU "
                                                     "reload bug; docs/servers.md)")
    rollouts: str | None = flag(None, "train on rollouts read from this folder (rollout.py output, or converted "
                                      "SGLang/vLLM responses; one batch folder per step, cycled) instead of "
                                      "generating them; with --r3 every sample must carry routes that fit the model")
    allow_other_model: bool = flag(False, "--rollouts: train even on rollouts whose recorded model "
                                          "(meta.model_digest, written by rollout.py) is not the model this run "
                                          "starts from (refused by default: their log-probs are another policy's)")
    out: str | None = flag(None, "run folder (default runs/TASK-MODE-DTYPE-sSEED)")
    resume: bool = flag(False, "continue from OUT/ckpt.pt (bit-identical metrics on CPU)")
    overwrite: bool = flag(False, "replace an existing run folder instead of refusing")
    save_every: int = flag(50, "checkpoint every N steps (atomic; also at the end)", domain=INT_GE1)
    no_plot: bool = flag(False, "skip the PNG plots at the end")
    quiet: bool = flag(False, "no per-step lines (the progress bar stays)")
    # the real-model path: HF checkpoint, jsonl prompts, FSDP2 under torchrun (r3/scale/fsdp.py)
    shards: int | None = flag(None, "cut each step's prompts into N data shards, each sampled with its own "
                                    "generator; under torchrun rank r takes shards r, r+W, ... and "
                                    "gradient-accumulates them. The same N gives the same run at any world size "
                                    "(default: the world size; 1 = the toy loop)", domain=INT_GE1)
    logprob_chunk: int | None = flag(None, "positions per lm_head chunk for trainer log-probs, so [B, T, V] "
                                           "logits never exist (then kl_full is None); 0 = full logits. Default: "
                                           "1024 if vocab > 4096, else 0", domain=INT_GE0)
    fsdp_param_dtype: str = flag("bf16", "under torchrun: FSDP2 compute dtype over fp32 master weights (gradients "
                                         "are reduced in fp32)", choices=["bf16", "fp32"])
    activation_checkpointing: bool = flag(False, "under torchrun: recompute each block in backward")
    dry_run: bool = flag(False, "print the per-GPU memory plan for --model (config.json only) or --preset, exit")
    world_size: int | None = flag(None, "--dry-run outside torchrun: GPUs to plan for (default 1)", domain=INT_GE1)
    plan_seq_len: int = flag(4096, "--dry-run: tokens per sequence (prompt + response)", domain=INT_GE1)

    def validate(self) -> None:
        super().validate()
        jsonl = self.task.startswith("jsonl:")
        bad = sorted(set(self.allowed_changes()) - set(RUN_DEFINING))
        if bad:
            raise ValueError(f"--allow-change {','.join(bad)}: not run-defining fields; choose from "
                             f"{', '.join(RUN_DEFINING)}")
        if self.eval_task and not (self.eval_task.startswith("jsonl:") and jsonl):
            raise ValueError("--eval-task takes jsonl:FILE, with a jsonl --task (the toy tasks hold out their own)")
        if self.fidelity_every and (self.engine != "local" or self.rollouts or self.model):
            raise ValueError("--fidelity-every needs the in-process engine on a toy preset (it samples with a second, "
                             "fp32 engine)")
        if self.group_size < 2:
            raise ValueError("--group-size must be >= 2: GRPO advantages need a group")
        if self.loss == "seq_is" and self.is_correction == "icepop":
            raise ValueError("--loss seq_is corrects its sequence weight with --is-correction tis or mis, not icepop")
        if self.is_correction != "none" and self.old_logp == "engine" and self.loss != "seq_is":
            raise ValueError(f"--is-correction {self.is_correction} weighs tokens by π_old / π_engine, which is 1 "
                             f"when --old-logp engine makes π_old the engine's: use --old-logp trainer")
        if self.dense and self.replay != "none":
            raise ValueError("--dense has no router, so there are no routes to replay: drop --r3/--replay")
        if self.engine != "local":
            from r3.rollout.remote import parse_engine
            try:
                parse_engine(self.engine)
            except ValueError as e:
                raise ValueError(f"--engine: {e}, or local") from None
        if self.rollout_lag and (self.engine != "local" or self.rollouts):
            raise ValueError("--rollout-lag delays the in-process engine's weight sync; a server engine loads every "
                             "update and --rollouts were sampled already: drop --rollout-lag")
        if self.allow_other_model and not self.rollouts:
            raise ValueError("--allow-other-model applies to --rollouts only")
        if self.eval_trainer and (self.model or not self.eval_every):
            raise ValueError("--eval-trainer evaluates a toy preset's trainer beside its engine: it needs "
                             "--eval-every >= 1 and no --model")
        if self.router_levels is not None and (self.engine != "local" or self.rollouts):
            raise ValueError("--router-levels sets the in-process engine's router; a server engine or --rollouts "
                             "samples with numerics this run does not set")
        if self.vllm_reload_method != "reload_weights" and not self.engine.startswith("vllm:"):
            raise ValueError("--vllm-reload-method applies to --engine vllm:URL")
        if self.sync_check != "error" and self.engine == "local":
            raise ValueError("--sync-check checks what a server engine serves; the in-process engine is synced in "
                             "memory")
        if self.engine != "local" and (self.rollouts or self.dense):
            raise ValueError("--engine samples with a server: drop --rollouts / --dense (a server engine returns "
                             "routes for an MoE)")
        if self.model and not jsonl and not self.dry_run:
            raise ValueError(f"--model needs --task jsonl:FILE: the toy task {self.task!r} has its own toy "
                             f"vocabulary, not the checkpoint's tokenizer")
        if jsonl and not self.model and not self.dry_run:
            raise ValueError(f"--task {self.task} needs --model PATH (a checkpoint with tokenizer.json): the toy "
                             f"presets have no tokenizer for its text prompts")

    def allowed_changes(self) -> list[str]:
        return [k.strip().replace("-", "_") for k in (self.allow_change or "").split(",") if k.strip()]

    @property
    def mode(self) -> str:
        return "dense" if self.dense else self.replay

    @property
    def clip_range(self) -> tuple[float, float]:
        """(ε_low, ε_high): the flags, else the loss's defaults (sequence-level GSPO ratios need a tight clip)."""
        low, high = (3e-4, 4e-4) if self.loss == "gspo" else (0.2, 0.28)
        return (low if self.clip_low is None else self.clip_low, high if self.clip_high is None else self.clip_high)

    def out_dir(self) -> str:
        name = self.task.replace(":", "").replace("/", "_")
        return self.out or f"runs/{name}-{self.mode}-{self.rollout_dtype}-s{self.seed}"

    def chunk_for(self, vocab_size: int) -> int:
        return default_chunk(vocab_size) if self.logprob_chunk is None else self.logprob_chunk

    def num_shards(self, world: int) -> int:
        return self.shards or world


# The fields that define a run: a --resume that changes one is refused unless --allow-change names it.
RUN_DEFINING = ("preset", "model", "dense", "task", "warmup_steps", "warmup_until", "router_levels", "seed",
                "init_seed", "prompts_per_step", "group_size", "rollout_dtype", "temperature", "top_p",
                "max_new_tokens", "replay", "lr", "lr_warmup", "rollout_lag",
                "grad_clip", "mini_steps", "loss", "old_logp", "clip_low", "clip_high", "is_correction", "is_cap",
                "engine", "rollouts", "shards", "logprob_chunk", "guard_reward_drop", "guard_kl_max", "on_collapse")


@dataclass(frozen=True)
class RolloutConfig(SamplingConfig):
    prompts_per_step: int = flag(64, "prompts in the batch (the same flag as train.py's)", domain=PROMPTS,
                                 alias="--num-prompts")
    out: str = flag(None, "output folder (batch.safetensors + manifest.json)", required=True)
    arch: str | None = flag(None, "architecture preset for a checkpoint whose metadata carries no model config",
                            choices=sorted(PRESETS))
    cache_dir: str = flag(".cache/warmup", "where warmed-up checkpoints are cached")
    no_mismatch: bool = flag(False, "skip the fp32-trainer mismatch summary")
    no_progress: bool = flag(False, "no tqdm bar during the warm-up")
    init_seed: int | None = flag(0, "seed of the preset's init and warm-up (0 here, unlike train.py, where it follows "
                                    "--seed: batches sampled with any --seed come from the model `train.py --seed 0` "
                                    "starts from)", domain=INT_GE0)

    def validate(self) -> None:
        super().validate()
        if self.task.startswith("jsonl:"):
            raise ValueError("rollout.py samples the toy tasks only; --task jsonl: needs train.py --model")


def check_domains(config) -> None:
    """Raise ValueError naming the first flag whose value lies outside its domain (None means 'default')."""
    for f in fields(config):
        domain, value = f.metadata.get("domain"), getattr(config, f.name)
        if domain is None or value is None:
            continue
        text, ok = domain
        if isinstance(value, float) and math.isnan(value) or not ok(value):
            raise ValueError(f"--{f.name.replace('_', '-')} must be {text}, got {value}")


def check_flags(p: argparse.ArgumentParser, args: argparse.Namespace, domains: dict) -> None:
    """The scripts with their own argparse block (r3.check, r3.inspect, r3.serve): refuse a flag outside its domain
    (`domains`: {dest: domain}) as `parse` does, in one line with exit status 2, before any work."""
    for dest, (text, ok) in domains.items():
        value = getattr(args, dest)
        if value is not None and (isinstance(value, float) and math.isnan(value) or not ok(value)):
            p.exit(2, f"{p.prog}: error: --{dest.replace('_', '-')} must be {text}, got {value}\n")


def build_parser(cls, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if cls is TrainConfig:
        p.add_argument("--r3", action="store_true", help="shorthand for --replay r3")
    for f in fields(cls):
        names = [f"--{f.name.replace('_', '-')}"] + ([f.metadata["alias"]] if f.metadata.get("alias") else [])
        kw = dict(dest=f.name, help=f.metadata["help"])
        tp = next((a for a in typing.get_args(f.type) if a is not type(None)), f.type)  # X | None -> X
        if tp is bool:
            p.add_argument(*names, action="store_true", **kw)
            continue
        kw.update(type=tp, default=f.default, required=f.metadata["required"])
        if f.metadata.get("choices"):
            kw["choices"] = f.metadata["choices"]
        p.add_argument(*names, **kw)
    return p


def parse(cls, argv=None, description: str = ""):
    """Parse argv into a validated `cls` (TrainConfig or RolloutConfig); bad values exit with the domain named."""
    p = build_parser(cls, description)
    ns = vars(p.parse_args(argv))
    if ns.pop("r3", False):
        if ns["replay"] not in ("none", "r3"):
            p.error(f"--r3 conflicts with --replay {ns['replay']}")
        ns["replay"] = "r3"
    config = cls(**ns)
    try:
        check_domains(config)
        config.validate()
    except ValueError as e:  # one line, without argparse's usage block: the message names the flag and its domain
        p.exit(2, f"{p.prog}: error: {e}\n")
    return config
