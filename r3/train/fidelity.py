"""Gradient fidelity: how far the update an arm takes is from the on-policy gradient (DESIGN.md, "Metrics").

At the current weights and on the step's prompts:
  g_arm  the gradient of the arm's first mini-step: samples from the arm's own engine (its --rollout-dtype),
         π_old from the trainer's old-policy pass (or the engine's log-probs, --old-logp engine), the arm's replay
         mode and loss (with the trainer's π_old the first mini-step's PPO ratio is 1). The whole batch is one
         mini-step here (training splits it into --mini-steps), so the estimate is less noisy than one mini-step's.
  g_on   the same loss on samples from an fp32 engine (no precision mismatch; the router picks, no replay).
Both engines sample with one freshly seeded generator (`coupled` sampling: the same random numbers at every
draw), so the two batches hold the same tokens except where the engines' probabilities differ enough to change a
draw; the difference between g_arm and g_on is then the mismatch's doing, not sampling noise.
Logged: fidelity/cos = cos(g_arm, g_on), fidelity/rel_err = ‖g_arm − g_on‖ / ‖g_on‖, fidelity/same_rows (the
fraction of sampled rows the two engines drew identically), and a noise floor: fidelity/cos_resample =
cos(g_on, g_on') with g_on' from an independent fp32 sample of the same prompts.

It never touches the training state: its generators are its own, gradients are zeroed afterwards, and the
weights are only read. A run with --fidelity-every N logs the same other metrics, bit for bit, as one without.
"""
import torch

from r3.train.collect import reward_batch
from r3.train.grpo import group_advantages, policy_loss
from r3.train.score import batch_groups, old_policy_pass, token_logp, update_reads_pass, without_pass


def arm_gradient(model, engine, task, examples, *, replay: str, seed: int, sample_kw: dict, loss_kw: dict,
                 chunk: int, old_logp: str = "trainer") -> tuple[torch.Tensor, torch.Tensor]:
    """(flat gradient of the first mini-step's loss on `engine`'s samples, the sampled tokens)."""
    g = torch.Generator().manual_seed(seed)
    batch = engine.generate([e.prompt for e in examples], generator=g, **sample_kw)
    reward_batch(task, batch, examples)
    adv, _ = group_advantages(batch.rewards, batch.group, normalize_std=loss_kw["loss"] != "dr_grpo")
    old = old_policy_pass(model, batch, replay=replay, temperature=sample_kw["temperature"], chunk=chunk,
                          measure=False) if update_reads_pass(replay, old_logp) else without_pass(batch, replay)
    model.zero_grad(set_to_none=True)
    logp = token_logp(model, batch.tokens, batch.attn_mask, old.routes, temperature=sample_kw["temperature"],
                      chunk=chunk, groups=batch_groups(batch)).logp
    loss, _ = policy_loss(logp, old.pi_old(batch, old_logp), adv, batch.loss_mask, rollout_logp_BT=batch.rollout_logp,
                          **loss_kw)
    loss.backward()
    flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                      for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return flat, batch.tokens


def _pad_to(tok_BT: torch.Tensor, T: int, pad_id: int) -> torch.Tensor:
    return torch.nn.functional.pad(tok_BT, (0, max(0, T - tok_BT.shape[1])), value=pad_id)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """None when either gradient is zero (every group's rewards tied, as on a solved task): it has no direction."""
    a, b = a.double(), b.double()
    return None if a.norm() == 0 or b.norm() == 0 else float(a @ b / (a.norm() * b.norm()))


def gradient_fidelity(model, engine, oracle, task, examples, *, replay: str, seed: int, sample_kw: dict,
                      loss_kw: dict, chunk: int, old_logp: str = "trainer") -> dict:
    """fidelity/* metrics at the current weights; `oracle` is an fp32 `Engine` (synced here)."""
    oracle.sync(model)
    kw = dict(sample_kw=sample_kw, loss_kw=loss_kw, chunk=chunk, old_logp=old_logp)
    g_arm, tok_arm = arm_gradient(model, engine, task, examples, replay=replay, seed=seed, **kw)
    g_on, tok_on = arm_gradient(model, oracle, task, examples, replay="none", seed=seed, **kw)
    g_on2, _ = arm_gradient(model, oracle, task, examples, replay="none", seed=seed + 7_919, **kw)
    same = float((_pad_to(tok_arm, tok_on.shape[1], sample_kw["pad_id"])
                  == _pad_to(tok_on, tok_arm.shape[1], sample_kw["pad_id"])).all(1).float().mean())
    cos = _cos(g_arm, g_on)
    rel_err = None if cos is None else float((g_arm - g_on).norm() / g_on.norm())
    return {"fidelity/cos": cos, "fidelity/rel_err": rel_err,
            "fidelity/same_rows": same, "fidelity/cos_resample": _cos(g_on, g_on2),
            "fidelity/grad_norm": float(g_arm.norm())}
