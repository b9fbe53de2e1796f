"""The trainer's forward with each GRPO group's prompt computed once, as the rollout engine's prefill does.

The G samples of a group share their prompt, token for token, so the trainer's hidden states, keys and values at
the prompt positions are the same in all G rows. `forward_shared_prefix` computes those positions once per group
(for the distinct groups among the rows given), then the response positions of every row, whose queries attend to
their group's prompt keys and values (gathered, so their gradients sum over the group) and to the row's own
earlier response positions. The output is the plain forward's, [B, T, .] with the same routes, computed on
U·Lp + B·(T - Lp) positions instead of B·T: at the headline's 33-token prompts and 33-token responses, about 55 %
of the positions of a 128-row old-policy pass and 70-75 % of a 32-row mini-step's.

It equals `Transformer.forward` up to float rounding: the same sums in another order, as when the same row is
computed in another batch (the plain forward is not bit-stable across batch compositions either). The tests check
logits, routes and gradients against the plain forward.

  shared_prefix(tokens, valid, group, prompt_len, routes)   SharedPrefix, or None when the rows do not share it
  forward_shared_prefix(model, ids, valid, routes, shared)  (logits or hidden, routes), as Transformer.forward

Rows may share a prefix only if their first `prompt_len` tokens, validity and (when replayed) routes all agree
with their group's first row; `shared_prefix` checks it and returns None otherwise (the caller then runs the plain
forward). Not for a KV cache (the engine has its own prefill) or the dense twin's routes (there are none, fine).
"""
from typing import NamedTuple

import torch

from r3.model.model import Transformer, attention_mask, rope_cos_sin
from r3.model.moe import check_routes


class SharedPrefix(NamedTuple):
    length: int              # Lp: positions 0 .. Lp-1 are the shared prompt (left padded)
    first_U: torch.Tensor    # [U] the row computed for each distinct group
    group_B: torch.Tensor    # [B] each row's index into first_U


def shared_prefix(tokens_BT: torch.Tensor, valid_BT: torch.Tensor, group_B: torch.Tensor, prompt_len: int | None,
                  routes_BTLK: torch.Tensor | None = None) -> SharedPrefix | None:
    """The groups of these rows whose first `prompt_len` positions agree (tokens, validity, replay routes), or None
    when any row differs from its group's first row, or nothing would be saved."""
    B, T = tokens_BT.shape
    if prompt_len is None or not 0 < prompt_len < T:
        return None
    groups, group_B = group_B.unique(return_inverse=True)
    if len(groups) == B:  # one row per group: nothing to share
        return None
    first_U = torch.full((len(groups),), B, dtype=torch.long).scatter_reduce(
        0, group_B, torch.arange(B), reduce="amin")
    rep = first_U[group_B]
    Lp = prompt_len
    same = (tokens_BT[:, :Lp] == tokens_BT[rep, :Lp]).all() and (valid_BT[:, :Lp] == valid_BT[rep, :Lp]).all()
    if routes_BTLK is not None:
        same = same and (routes_BTLK[:, :Lp] == routes_BTLK[rep, :Lp]).all()
    return SharedPrefix(Lp, first_U, group_B) if same else None


def forward_shared_prefix(model: Transformer, ids_BT: torch.Tensor, *, valid_BT: torch.Tensor,
                          routes_BTLK: torch.Tensor | None, shared: SharedPrefix, return_hidden: bool = False):
    """`model(ids_BT, valid_BT=valid_BT, routes_BTLK=routes_BTLK, return_hidden=...)` with the prompt positions
    computed once per group (module docstring). Returns (logits or hidden [B, T, .], routes [B, T, L, K] or None)."""
    cfg = model.cfg
    B, T = ids_BT.shape
    Lp, first_U, g_B = shared
    U, R = len(first_U), T - Lp
    if routes_BTLK is not None:
        check_routes(routes_BTLK, batch=B, seq=T, num_layers=cfg.num_hidden_layers, top_k=cfg.num_experts_per_tok,
                     num_experts=cfg.num_experts)
    valid_U, valid_R = valid_BT[first_U, :Lp], valid_BT[:, Lp:]
    mask_U = attention_mask(valid_U, None, U, Lp, ids_BT.device)
    mask_R = attention_mask(valid_BT, None, B, T, ids_BT.device)[:, :, Lp:]  # response rows of the plain mask
    pos_U = (valid_U.long().cumsum(1) - 1).clamp(min=0)
    pos_R = (valid_U.sum(1)[g_B, None] + valid_R.long().cumsum(1) - 1).clamp(min=0)
    x_U, x_R = model.model.embed_tokens(ids_BT[first_U, :Lp]), model.model.embed_tokens(ids_BT[:, Lp:])
    cs_U, cs_R = rope_cos_sin(pos_U, cfg.head_dim, cfg.rope_theta, x_U.dtype), \
        rope_cos_sin(pos_R, cfg.head_dim, cfg.rope_theta, x_R.dtype)
    used_U, used_R = [], []
    for i, layer in enumerate(model.model.layers):
        kv = []
        x_U = x_U + layer.self_attn(layer.input_layernorm(x_U), *cs_U, mask_U, None, i, kv_out=kv)
        k_U, v_U = kv[0]
        x_R = x_R + layer.self_attn(layer.input_layernorm(x_R), *cs_R, mask_R, None, i, prefix=(k_U[g_B], v_U[g_B]))
        h = torch.cat([layer.post_attention_layernorm(x_U).flatten(0, 1),
                       layer.post_attention_layernorm(x_R).flatten(0, 1)])[None]
        replay = None if routes_BTLK is None else torch.cat([routes_BTLK[first_U, :Lp, i].flatten(0, 1),
                                                             routes_BTLK[:, Lp:, i].flatten(0, 1)])[None]
        y, ids = layer.mlp(h, replay)
        y_U, y_R = y[0].split([U * Lp, B * R])
        x_U, x_R = x_U + y_U.view(U, Lp, -1), x_R + y_R.view(B, R, -1)
        if ids is not None:
            ids_U, ids_R = ids[0].split([U * Lp, B * R])
            used_U.append(ids_U.view(U, Lp, -1))
            used_R.append(ids_R.view(B, R, -1))
    x = model.model.norm(torch.cat([x_U[g_B], x_R], 1))
    routes = None if cfg.dense else torch.cat([torch.stack(used_U, 2)[g_B], torch.stack(used_R, 2)], 1)
    return (x if return_hidden else model.lm_head(x)), routes
