"""What this proves: routes obtained by reusing cached positions (a GRPO group's shared prompt, earlier turns of a
conversation) equal the routes of a fresh full prefill on the same numerics (fp32), while only the new positions are
computed: group prefill work is 1/G, a continued turn computes only its new chunk."""
import torch

from r3.rollout.engine import Engine
from r3.model.model import ModelConfig, build_model

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
KW = dict(eos_ids=(14,), pad_id=15)


def engine(seed=0):
    model = build_model(CFG, seed).init_weights(seed, std=0.2)
    with torch.no_grad():  # make EOS likely so rows end at different lengths (padding inside the conversation)
        model.lm_head.weight[14] += 0.2 * model.model.norm.weight.sign()
    return Engine(model, "fp32")


def full_forward_routes(eng, b):
    logits, routes = eng.model(b.tokens[:, :-1], valid_BT=b.attn_mask[:, :-1])
    logp = logits.log_softmax(-1).gather(-1, b.tokens[:, 1:, None])[..., 0]
    return routes, logp


def test_group_prefill_is_one_gth_of_the_work_and_routes_equal_separate_prefills():
    eng, G = engine(), 4
    b, cache = eng.generate(PROMPTS, max_new_tokens=6, group_size=G, generator=torch.Generator().manual_seed(0),
                            return_cache=True, **KW)
    Lp = b.meta["prompt_len"]
    assert cache.prefill_tokens == len(PROMPTS) * Lp  # measured: positions the prefill forward computed
    assert b.meta["prefill_tokens_requested"] == G * cache.prefill_tokens
    alone = eng.generate([p for p in PROMPTS for _ in range(G)], max_new_tokens=6, group_size=1,
                         generator=torch.Generator().manual_seed(0), **KW)
    assert alone.meta["prefill_tokens_computed"] == G * b.meta["prefill_tokens_computed"]
    v = b.attn_mask[:, :Lp - 1]
    assert torch.equal(b.routes[:, :Lp - 1][v], alone.routes[:, :Lp - 1][v])


def test_continued_turns_reuse_routes_and_equal_a_fresh_full_prefill():
    eng, G = engine(1), 2
    g = torch.Generator().manual_seed(1)
    b1, cache = eng.generate(PROMPTS, max_new_tokens=5, group_size=G, generator=g, return_cache=True, **KW)
    assert b1.response_mask.sum(1).min() < b1.response_mask.sum(1).max(), "want rows of different lengths"
    B, T1 = b1.tokens.shape
    turns = [[10, 2 + i % 3] + [3] * (i % 2) for i in range(B)]  # tool/user tokens, different lengths per row
    b2, cache = eng.continue_generation(b1, cache, turns, max_new_tokens=4, generator=g, return_cache=True, **KW)
    C = 1 + max(len(t) for t in turns)
    assert b2.meta["prefill_tokens_computed"] == B * C and b2.meta["prefill_tokens_reused"] == B * (T1 - 1)
    assert cache.prefill_tokens == len(PROMPTS) * b1.meta["prompt_len"] + B * C  # measured, not just declared
    turns3 = [[11] for _ in range(B)]
    b3 = eng.continue_generation(b2, cache, turns3, max_new_tokens=3, generator=g, **KW)
    assert b3.meta["turns"] == 3
    assert torch.equal(b3.routes[:, :T1 - 1], b1.routes)  # earlier turns' routes come from the cache unchanged
    routes, logp = full_forward_routes(eng, b3)
    v = b3.attn_mask[:, :-1]
    assert torch.equal(routes[v], b3.routes.long()[v])  # fp32: reuse == fresh full prefill
    m = b3.loss_mask
    assert (logp - b3.rollout_logp)[m].abs().max() < 1e-5
    for i in range(B):  # the turn tokens sit right after each row's previous tokens, and are not responses
        row = b3.tokens[i][b3.attn_mask[i]].tolist()
        n1 = int(b1.attn_mask[i].sum())
        assert row[n1:n1 + len(turns[i])] == turns[i]
        assert not b3.response_mask[i, T1:T1 + C - 1].any()


def test_recording_off_samples_the_same_tokens_and_keeps_no_routes():
    eng = engine(2)
    a = eng.generate(PROMPTS, max_new_tokens=5, group_size=2, generator=torch.Generator().manual_seed(3), **KW)
    b = eng.generate(PROMPTS, max_new_tokens=5, group_size=2, generator=torch.Generator().manual_seed(3),
                     record_routes=False, **KW)
    assert torch.equal(a.tokens, b.tokens) and b.routes is None and a.routes is not None
