"""Where a toy run's model comes from: a preset, taught the task format by a cached supervised warm-up, or a file.

RL from random init gives all-zero rewards on these tasks, so every arm of an ablation starts from the same
short supervised warm-up. The checkpoint is cached under a key of everything that determines it, so arms and seeds
that share those share one file, byte for byte, and a cache can never serve weights that today's code would not
make: the model config, task spec, steps, batch, lr and seed; a digest of the source files that build the weights
(`WARMUP_SOURCES`: model, moe, warmup, tasks, checkpoint); a digest of the warm-up's whole data stream (every
example it trains on, drawn as the warm-up draws them); torch's version and the CPU kernels it picks. A cached
file whose recorded key differs from the one asked for, or whose weights are not all finite, is reported by path
and rebuilt, as is one that cannot be read (truncated, corrupt, another model); a warm-up that diverges to
non-finite weights is an error, never cached. The warm-up always runs on one thread: with two, float reduction
order differs, the MoE routes a few tokens differently, and the weights would depend on the machine. Cache files
are written atomically (temp, fsync, rename). Left out: other code the warm-up calls into (torch itself is covered
by its version), so an edit elsewhere in r3 that changed the warm-up's numbers would need one of these files to
change too. `load_model` is the one entry point for rollout.py and the experiments: a preset (warmed up) or a
safetensors checkpoint.

Start-matched seeds (`until`, train.py `--warmup-until R`): a fixed number of steps leaves some init seeds far
lower than others on a steep supervised curve, and a run that starts low may never climb. With `until`, every
PROBE_EVERY steps (every step once a probe has passed half of R: the supervised curve is steep there, 0.2 to 0.4 in
five steps) the model samples PROBE_PROMPTS training prompts x PROBE_SAMPLES (one fixed set and generator,
the same for every seed, on the fp32 engine: no rollout numerics), and the warm-up stops at the first check whose
mean reward reaches R, or at `steps`, the cap. The learning-rate schedule is the cap's, so the steps taken are
those of a `steps`-step warm-up cut short. The count and the probe's reward are in the cache file's metadata
(`warmup_info`), which train.py copies into OUT/run.json.
"""
import dataclasses
import fcntl
import hashlib
import json
import os

import torch
import torch.nn.functional as F
from tqdm import tqdm

from safetensors import safe_open

from r3.runs.checkpoint import checkpoint_config, load_weights, save_weights
from r3.model.model import PRESETS, ModelConfig, Transformer, build_model
from r3.tasks.tasks import EOS, PAD, Task

R3 = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the r3 package
PROBE_EVERY, PROBE_PROMPTS, PROBE_SAMPLES, PROBE_SEED = 5, 64, 2, 7_777
WARMUP_SOURCES = tuple(os.path.join(R3, f) for f in (
    "model/model.py", "model/moe.py", "train/warmup.py", "tasks/tasks.py", "runs/checkpoint.py"))


def preset_config(name: str, task: Task | None = None, *, dense: bool = False) -> ModelConfig:
    """Preset `name` (its dense twin with `dense`), its vocabulary widened to cover `task`'s (cipher: 80 ids) and
    its positions to the longest prompt + response of a task made to be long (chain:T); a prompt too long for the
    other tasks stays a refusal."""
    if name not in PRESETS:
        raise SystemExit(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    cfg = PRESETS[name].dense_twin() if dense else PRESETS[name]
    if task is not None and task.vocab_size > cfg.vocab_size:
        cfg = dataclasses.replace(cfg, vocab_size=task.vocab_size)
    if task is not None and task.widens_positions and \
            task.max_prompt_len + task.max_new_tokens > cfg.max_position_embeddings:
        cfg = dataclasses.replace(cfg, max_position_embeddings=task.max_prompt_len + task.max_new_tokens)
    return cfg


def sft_tensors(examples, pad_id: int = PAD):
    """Prompt (left-padded) + answer + EOS (right-padded): tokens [B, T], valid [B, T], target mask [B, T-1]."""
    Lp = max(len(e.prompt) for e in examples)
    La = max(len(e.answer) for e in examples) + 1
    B = len(examples)
    tokens = torch.full((B, Lp + La), pad_id, dtype=torch.long)
    valid = torch.zeros(B, Lp + La, dtype=torch.bool)
    target = torch.zeros(B, Lp + La, dtype=torch.bool)
    for i, e in enumerate(examples):
        ans = e.answer + [EOS]
        tokens[i, Lp - len(e.prompt):Lp] = torch.tensor(e.prompt)
        tokens[i, Lp:Lp + len(ans)] = torch.tensor(ans)
        valid[i, Lp - len(e.prompt):Lp + len(ans)] = True
        target[i, Lp:Lp + len(ans)] = True
    return tokens, valid, target[:, 1:]


def probe_reward(model: Transformer, task: Task) -> float:
    """Mean sampled reward of the model (fp32 engine, temperature 1) on the fixed probe set of `--warmup-until`."""
    from r3.train.collect import reward_batch  # collect imports the engine, which imports the model: not at the top
    from r3.rollout.engine import Engine
    g = torch.Generator().manual_seed(PROBE_SEED)
    examples = task.sample(PROBE_PROMPTS, g, split="train")
    batch = Engine(model, "fp32").generate([e.prompt for e in examples], max_new_tokens=task.max_new_tokens,
                                           eos_ids=(EOS,), pad_id=PAD, group_size=PROBE_SAMPLES, generator=g)
    reward_batch(task, batch, examples)
    return float(batch.rewards.mean())


def supervised_warmup(model: Transformer, task: Task, *, steps: int, batch_size: int = 64, lr: float = 3e-3,
                      seed: int = 0, progress: bool = True, until: float | None = None,
                      probes: list | None = None) -> list[float]:
    """`steps` supervised steps (cosine to 10 % of lr); with `until`, stop at the first probe (every PROBE_EVERY
    steps, every step from half of `until` on) whose reward reaches it. `probes` (a list) receives (steps done,
    probe reward) per probe."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, near = [], False
    for step in tqdm(range(steps), desc="warm-up", disable=not progress, leave=False):
        if until is not None and (step % PROBE_EVERY == 0 or near):
            reward = probe_reward(model, task)
            if probes is not None:
                probes.append((step, reward))
            if reward >= until:
                break
            near = reward >= until / 2  # the curve is steep: from half-way on, a probe every step
        tokens, valid, target = sft_tensors(task.sample(batch_size, g))
        logits, _ = model(tokens[:, :-1], valid_BT=valid[:, :-1])
        nll = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
        loss = (nll * target).sum() / target.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:  # cosine decay to 10%
            group["lr"] = lr * (0.55 + 0.45 * torch.cos(torch.tensor(step / steps * torch.pi)).item())
        opt.step()
        losses.append(loss.item())
    else:
        if until is not None and probes is not None:  # the cap: the reward it ends at
            probes.append((steps, probe_reward(model, task)))
    return losses


def source_digest(paths=None) -> str:
    """sha256 over the files that build the warm-up's weights (default `WARMUP_SOURCES`), names and contents."""
    h = hashlib.sha256()
    for path in WARMUP_SOURCES if paths is None else paths:
        h.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def stream_digest(task: Task, *, steps: int, batch_size: int, seed: int) -> str:
    """sha256 of every example `supervised_warmup` trains on: the same generator, seed and draws."""
    g, h = torch.Generator().manual_seed(seed), hashlib.sha256()
    for _ in range(steps):
        for e in task.sample(batch_size, g):
            h.update(json.dumps([e.prompt, e.answer]).encode())
    return h.hexdigest()[:16]


def warmup_key(cfg: ModelConfig, task: Task, task_spec: str, *, steps: int, seed: int, batch_size: int,
               lr: float, until: float | None = None) -> dict:
    """Everything that determines the warmed-up weights, as JSON gives it back (`checkpoint_config` reads `cfg`)."""
    key = dict(cfg=dataclasses.asdict(cfg), task=task_spec, steps=steps, seed=seed, batch_size=batch_size, lr=lr,
               threads=1, code=source_digest(), data=stream_digest(task, steps=steps, batch_size=batch_size, seed=seed),
               torch=torch.__version__, cpu=torch.backends.cpu.get_cpu_capability())
    if until is not None:  # absent otherwise, so the fixed-step warm-ups keep their cache files
        key["until"] = dict(reward=until, every=PROBE_EVERY, prompts=PROBE_PROMPTS, samples=PROBE_SAMPLES,
                            seed=PROBE_SEED)
    return json.loads(json.dumps(key))


def _cached(model: Transformer, path: str, key: dict) -> tuple[Transformer | None, str]:
    """(the model loaded from the cache file, "") when it holds `key` and finite weights, else (None, why not)."""
    try:
        with safe_open(path, framework="pt") as f:
            recorded = json.loads((f.metadata() or {}).get("r3", "{}")).get("key")
        load_weights(model, path)
    except Exception as e:  # truncated, corrupt, non-finite, unreadable metadata, another model: only a cache
        return None, f"is unreadable ({e})"
    if recorded != key:
        diff = sorted(k for k in set(key) | set(recorded or {}) if (recorded or {}).get(k) != key.get(k))
        return None, f"was made under another key (differs in {', '.join(diff)})"
    return model, ""  # load_weights has refused any non-finite weight


def warmed_up_model(cfg: ModelConfig, task: Task, task_spec: str, *, steps: int, seed: int = 0,
                    batch_size: int = 64, lr: float = 3e-3, cache_dir: str = ".cache/warmup",
                    progress: bool = True, until: float | None = None) -> tuple[Transformer, str]:
    """Build `cfg` from `seed`, warm it up on `task` (or load the cached result). Returns (model, path).

    Arms of a sweep start in parallel and share the cache: a lock on `PATH.lock` makes the first build it while the
    others wait, then load it (two writers of one cache file would race on its temporary file)."""
    key = warmup_key(cfg, task, task_spec, steps=steps, seed=seed, batch_size=batch_size, lr=lr, until=until)
    path = os.path.join(cache_dir, hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
                        + ".safetensors")
    os.makedirs(cache_dir, exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or by the OS if this process dies
        if os.path.exists(path):
            model, why = _cached(build_model(cfg, seed), path, key)
            if model is not None:
                return model, path
            print(f"warm-up cache {path} {why}; rebuilding it")
            os.remove(path)
        model = build_model(cfg, seed)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the result must not depend on the machine: MoE routing amplifies reduction order
        probes = []
        try:
            if steps > 0:
                losses = supervised_warmup(model, task, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                                           progress=progress, until=until, probes=probes)
        finally:
            torch.set_num_threads(threads)
        bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise RuntimeError(f"the supervised warm-up diverged: {len(bad)} parameter(s) non-finite after {steps} "
                               f"steps at lr {lr} (first {bad[0]}); nothing was cached")
        info = dict(steps=len(losses) if steps > 0 else 0)
        if until is not None:
            info.update(until=until, probe_reward=probes[-1][1], reached=probes[-1][1] >= until,
                        probes=[[n, round(r, 4)] for n, r in probes])
        save_weights(model, path, dict(key=key, warmup=info))
    return model, path


def warmup_info(path: str) -> dict | None:
    """What the warm-up cached at `path` did: {steps, and with --warmup-until: until, probe_reward, reached,
    probes}; None for a file written before this was recorded."""
    with safe_open(path, framework="pt") as f:
        return json.loads((f.metadata() or {}).get("r3", "{}")).get("warmup")


def load_model(spec: str, *, path: str | None = None, dense: bool, task: Task, task_spec: str, warmup_steps: int,
               init_seed: int, cache_dir: str = ".cache/warmup", arch: str | None = None,
               progress: bool = True, warmup_until: float | None = None) -> tuple[Transformer, str]:
    """Preset `spec` (built from init_seed, then warmed up on the task, cached), or the checkpoint at `path` when given:
    an HF folder, or a safetensors file (`r3.runs.checkpoint.save_weights`; its architecture comes from its metadata,
    else from `arch`).

    Returns (model in fp32 eval mode, a one-line description of where it came from).
    """
    if path is None:
        cfg = preset_config(spec, task, dense=dense)
        if warmup_steps > 0:
            model, path = warmed_up_model(cfg, task, task_spec, steps=warmup_steps, seed=init_seed,
                                          cache_dir=cache_dir, progress=progress, until=warmup_until)
            steps = warmup_steps if warmup_until is None else \
                f"{(warmup_info(path) or {}).get('steps')} (until reward {warmup_until}, at most {warmup_steps})"
            desc = f"preset {spec}{' (dense twin)' if dense else ''}, {steps} SFT warm-up steps on " \
                   f"{task_spec}, init seed {init_seed} ({path})"
        else:
            model, desc = build_model(cfg, init_seed), f"preset {spec}{' (dense twin)' if dense else ''}, " \
                                                       f"random init seed {init_seed}"
        return model.float().eval(), desc
    if os.path.isdir(path):  # an HF Qwen3-MoE folder, as train.py --model takes
        from r3.scale.hf import load_pretrained
        return load_pretrained(path, dtype=torch.float32).eval(), f"HF checkpoint {path}"
    if not os.path.isfile(path):
        raise SystemExit(f"--model {path!r} is neither an HF checkpoint folder nor a safetensors file (save_weights)")
    cfg = checkpoint_config(path)
    if cfg is None:
        if arch is None:
            raise SystemExit(f"{path}: no model config in the checkpoint metadata; pass --arch PRESET")
        cfg = preset_config(arch, task, dense=dense)
    if dense and not cfg.dense:
        raise SystemExit(f"{path} is an MoE checkpoint; --dense cannot turn it into the dense twin")
    return load_weights(Transformer(cfg), path).float().eval(), f"checkpoint {path}{' (dense)' if cfg.dense else ''}"
