"""What this proves: the trainer's forward with each group's prompt computed once (r3/model/prefix.py) gives the plain
forward's logits (1e-5), routes (equal) and gradients (relative error 1e-5), with left-padded prompts of several
lengths, padded responses, replayed routes and the dense twin; it is used only where rows really share their
prompt (tokens, validity, replayed routes), and computes fewer positions."""
import torch

from r3.rollout.engine import Engine
from r3.model.model import PRESETS, build_model
from r3.model.prefix import forward_shared_prefix, shared_prefix
from r3.train.score import batch_groups, token_logp
from r3.tasks.tasks import EOS, PAD, make_task


def rollout(dense=False, dtype="bf16", seed=0):
    task = make_task("sort:3-6")  # prompts of 5-8 tokens: left padding
    cfg = PRESETS["toy"].dense_twin() if dense else PRESETS["toy"]
    model = build_model(cfg, seed).init_weights(seed, std=0.2)
    g = torch.Generator().manual_seed(seed)
    b = Engine(model, dtype).generate([e.prompt for e in task.sample(5, g)], max_new_tokens=8, eos_ids=(EOS,),
                                      pad_id=PAD, group_size=3, generator=g)
    assert (~b.attn_mask).any(), "the test needs padding"
    return model, b


def grads(model, fn):
    model.zero_grad(set_to_none=True)
    out = fn()
    (out.float().log_softmax(-1)[..., :4] * torch.arange(1.0, 5.0)).sum().backward()
    return out.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_equals_the_plain_forward():
    for dense in (False, True):
        model, b = rollout(dense)
        ids, valid = b.tokens[:, :-1], b.attn_mask[:, :-1]
        for routes in ([None] if dense else [None, b.routes]):
            sp = shared_prefix(ids, valid, b.group, b.meta["prompt_len"], routes)
            assert sp is not None and len(sp.first_U) == 5
            with torch.no_grad():
                a, ra = model(ids, valid_BT=valid, routes_BTLK=routes)
                c, rc = forward_shared_prefix(model, ids, valid_BT=valid, routes_BTLK=routes, shared=sp)
            assert torch.allclose(a, c, atol=1e-5, rtol=0)
            assert (ra is None and rc is None) if dense else torch.equal(ra, rc)
            la, ga = grads(model, lambda: model(ids, valid_BT=valid, routes_BTLK=routes)[0])
            lc, gc = grads(model, lambda: forward_shared_prefix(model, ids, valid_BT=valid, routes_BTLK=routes,
                                                                  shared=sp)[0])
            assert ((ga - gc).norm() / ga.norm()) < 1e-5


def test_minibatch_rows_and_token_logp():
    model, b = rollout()
    rows = torch.tensor([0, 2, 3, 7, 8, 14])  # groups 0, 0, 1, 2, 2, 4
    sub = b.select(rows)
    plain = token_logp(model, sub.tokens, sub.attn_mask, sub.routes, temperature=0.7, chunk=0)
    shared = token_logp(model, sub.tokens, sub.attn_mask, sub.routes, temperature=0.7, chunk=0,
                        groups=batch_groups(b, rows))
    assert torch.allclose(plain.logp, shared.logp, atol=1e-5) and torch.equal(plain.routes, shared.routes)
    chunked = token_logp(model, sub.tokens, sub.attn_mask, None, temperature=0.7, chunk=4,
                         groups=batch_groups(b, rows))  # the large-vocabulary path (hidden states, chunked head)
    assert torch.allclose(token_logp(model, sub.tokens, sub.attn_mask, None, temperature=0.7, chunk=4).logp,
                          chunked.logp, atol=1e-5)
    sp = shared_prefix(sub.tokens[:, :-1], sub.attn_mask[:, :-1], sub.group, b.meta["prompt_len"])
    U, Lp, T = len(sp.first_U), sp.length, sub.tokens.shape[1] - 1
    assert U == 4 and U * Lp + len(rows) * (T - Lp) < len(rows) * T  # fewer positions computed


def test_refuses_rows_that_do_not_share():
    model, b = rollout()
    ids, valid, Lp = b.tokens[:, :-1], b.attn_mask[:, :-1], b.meta["prompt_len"]
    assert shared_prefix(ids, valid, torch.arange(len(b)), Lp) is None  # one row per group
    other = ids.clone()
    other[1, Lp - 1] = (other[1, Lp - 1] + 1) % 10  # row 1's prompt differs from its group's
    assert shared_prefix(other, valid, b.group, Lp) is None
    routes = b.routes.clone()
    routes[2, Lp - 1, 0] = routes[2, Lp - 1, 0].flip(0)  # row 2 replays its prompt differently from its group
    assert shared_prefix(ids, valid, b.group, Lp, routes) is None
    assert shared_prefix(ids, valid, b.group, None) is None
