"""Where a setting puts the toy: the routing and probability mismatch between its engine and the fp32 trainer.

  setting_spec(name, depth, walk_T)   what a setting is: preset, task, engine dtype, --router-levels
  start_model(spec, seed)             the start-matched warm-up of a seed (cached: train.py's runs load the same file)
  measure(model, task, spec)          one fixed probe batch (MEASURE_PROMPTS x MEASURE_SAMPLES, seeded) sampled by the
                                      setting's engine and scored by the trainer, normally and replaying the engine's
                                      routes: router / token flip rates, flips per token, |log r| quantiles,
                                      extreme_frac F(2), kl (k3) without and with R3, response length, entropy,
                                      exposure S = length x kl, and the sampled reward
  step_model(run_dir, spec, step)     the policy of a run at `step`, from its ckpt.pt (refused at any other step)
Quantities are the ones r3/train/metrics.py logs during training, over the same response tokens.
"""
import dataclasses
import os

import torch

from experiments.regime.design import (ENGINE, MEASURE_PROMPTS, MEASURE_SAMPLES, MEASURE_SEED, POSITIONS, QUANTILES,
                                       WARMUP_CAP, WARMUP_UNTIL)
from r3.train.collect import rollout
from r3.errors import InputError
from r3.model.model import ModelConfig, Transformer
from r3.train.score import old_policy_pass
from r3.tasks.tasks import make_task
from r3.train.warmup import preset_config, warmed_up_model, warmup_info

CIPHER = "cipher:32-32"


def deep_config(layers: int, vocab: int = 80) -> ModelConfig:
    """Qwen3-30B-A3B's routing shape at toy width (8 of 128 experts, norm_topk_prob) at `layers` layers."""
    return ModelConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, moe_intermediate_size=16, num_experts=128,
                       num_experts_per_tok=8, norm_topk_prob=True)


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    task: str
    dtype: str
    router_levels: int | None
    preset: str = "toy"
    layers: int | None = None  # the deep preset at a depth the depth rule is measuring (no preset name yet)

    def config(self, task) -> ModelConfig:
        if self.layers is not None:
            return deep_config(self.layers, max(80, task.vocab_size))
        return preset_config(self.preset, task)


def setting_spec(name: str, *, paper: str | None = None, walk_T: int | None = None) -> Spec:
    """A grid setting by name: a dial position, `oracle`, `deep`, `walk` (at the paper-matched position)."""
    if name in POSITIONS:
        return Spec(name, CIPHER, ENGINE, POSITIONS[name])
    if name == "oracle":
        return Spec(name, CIPHER, "fp32", None)
    if name == "deep":
        return Spec(name, CIPHER, ENGINE, None, preset="qwen3-routing")
    if name == "walk":
        if paper is None or walk_T is None:
            raise ValueError("the walk setting needs the paper-matched position and its length T")
        return Spec(name, f"walk:{walk_T}", ENGINE, POSITIONS[paper])
    raise InputError(f"unknown setting {name!r}: a dial position ({', '.join(POSITIONS)}), oracle, deep or walk")


def start_model(spec: Spec, seed: int, cache_dir: str = ".cache/warmup", progress: bool = False):
    """(model, task, warm-up info) of `seed` under the study's start-matched warm-up: the file train.py loads."""
    task = make_task(spec.task)
    model, path = warmed_up_model(spec.config(task), task, spec.task, steps=WARMUP_CAP, seed=seed,
                                  cache_dir=cache_dir, progress=progress, until=WARMUP_UNTIL)
    return model.float().eval(), task, warmup_info(path)


def step_model(run_dir: str, spec: Spec, step: int) -> Transformer:
    """The trainer's weights in `run_dir`/ckpt.pt, which must be at `step` (a longer run has moved past it)."""
    path = os.path.join(run_dir, "ckpt.pt")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state["step"] != step:
        raise InputError(f"{path} is at step {state['step']}, not {step}: the run went on past the measurement; "
                         f"measure in a fresh --runs-dir")
    task = make_task(spec.task)
    model = Transformer(spec.config(task))
    model.load_state_dict(state["model"], strict=True)
    return model.float().eval()


@torch.no_grad()
def measure(model: Transformer, task, spec: Spec, prompts: int = MEASURE_PROMPTS,
            samples: int = MEASURE_SAMPLES, engine=None) -> dict:
    """The regime quantities of `model` under the setting's engine (or `engine` as it is: a lagged engine restored
    from a checkpoint), on one seeded probe batch."""
    batch, _ = rollout(model, task, num_prompts=prompts, group_size=samples, dtype=spec.dtype,
                       router_levels=spec.router_levels, seed=MEASURE_SEED, engine=engine)
    mask = batch.loss_mask
    none = old_policy_pass(model, batch, replay="none")
    out = dict(none.metrics)
    if batch.routes is not None:
        r3 = old_policy_pass(model, batch, replay="r3", own_routes=none.own_routes)
        out["kl_r3"] = r3.metrics["kl"]
        out["extreme_frac_r3"] = r3.metrics["extreme_frac"]
    abs_log_r = (none.logp - batch.rollout_logp).abs()[mask].double()
    for q in QUANTILES:
        out[f"abs_log_ratio_q{q * 100:g}"] = float(torch.quantile(abs_log_r, q))
    out["response_length"] = float(batch.response_mask.sum(1).float().mean())
    out["exposure"] = out["response_length"] * out["kl"]
    out["reward"] = float(batch.rewards.mean())
    out["tokens"] = int(mask.sum())
    out.pop("kl_full", None)  # needs the engine's full distribution, not kept here
    return out
