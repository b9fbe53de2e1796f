"""What this proves: every route codec round-trips exactly (any E <= 256, any k <= E, multi-limb ranks included) at
its stated size, corrupt payloads and files are refused with errors naming the problem, replay does not depend on the
order of a token's k ids (so set codecs are safe), and saved rollouts load back validated, naming bad rows."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from r3.rollout.batch import load_batch, load_rollouts, save_batch
from r3.rollout.engine import Engine
from r3.model.model import ModelConfig, build_model
from r3.model.moe import RoutesError
from r3.model.routing import (CODECS, DEFAULT_FILE_CODEC, SET_CODECS, decode_routes, encode_routes, encoded_nbytes,
                              rank_bits, row_bits)

GEOMETRIES = [(1, 1), (7, 3), (8, 2), (8, 8), (128, 8), (256, 1), (256, 8), (256, 40), (200, 100), (256, 128),
              (256, 255), (256, 256)]
CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)


def random_routes(n, E, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, E, generator=g).argsort(-1)[:, :K]  # distinct ids, random (unsorted) order


@pytest.mark.parametrize("E,K", GEOMETRIES)
@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_exact_at_stated_size(codec, E, K):
    ids = random_routes(60, E, K).view(3, 4, 5, K)
    data = encode_routes(ids, codec, E)
    assert data.dtype == torch.uint8 and data.numel() == encoded_nbytes(codec, 60, E, K)
    out = decode_routes(data, codec, ids.shape, E).long()
    want = ids.sort(-1).values if codec in SET_CODECS else ids
    assert torch.equal(out, want)


def test_extreme_sets_and_headline_sizes():
    for E, K in [(256, 128), (256, 8), (128, 8)]:  # smallest and largest rank, multi-limb and single-limb
        ids = torch.stack([torch.arange(K), torch.arange(E - K, E), torch.arange(0, 2 * K, 2) % E])
        ids = ids[:, :K] if E >= 2 * K else ids[:2]
        assert torch.equal(decode_routes(encode_routes(ids, "rank", E), "rank", ids.shape, E).long(), ids)
    assert rank_bits(256, 128) == 252
    assert {c: row_bits(c, 128, 8) for c in CODECS} == dict(bool_mask=1024, bitmask=128, int32=256, uint8=64,
                                                            packed=56, rank=41)


def test_corrupt_payloads_are_refused():
    E, K = 8, 2
    ids = random_routes(10, E, K)
    cases = {
        "bytes": ("rank", lambda d: d[:-1]),
        "0 and 1": ("bool_mask", lambda d: d.index_fill(0, torch.tensor([3]), 7)),
        "experts set": ("bool_mask", lambda d: d.index_fill(0, torch.tensor([0, 1, 2]), 1)),
        "beyond expert": ("bitmask", lambda d: d),  # E = 8 leaves no spare bits; checked at E = 5 below
        "padding bits": ("packed", lambda d: d.index_fill(0, torch.tensor([d.numel() - 1]), 255)),
        "out of range": ("uint8", lambda d: d.index_fill(0, torch.tensor([4]), 9)),
        "duplicate": ("uint8", lambda d: d.index_fill(0, torch.tensor([4, 5]), 3)),
    }
    for words, (codec, corrupt) in cases.items():
        if words == "beyond expert":
            d = encode_routes(random_routes(10, 5, 2), "bitmask", 5).index_fill(0, torch.tensor([0]), 0b11000001)
            with pytest.raises(RoutesError, match=words):
                decode_routes(d, "bitmask", (10, 2), 5)
            continue
        with pytest.raises(RoutesError, match=words):
            decode_routes(corrupt(encode_routes(ids, codec, E)), codec, (10, K), E)
    big = encode_routes(torch.tensor([[1, 2, 3]]), "rank", 7)  # C(7,3) = 35 needs 6 bits: 63 is not a rank
    with pytest.raises(RoutesError, match="rank"):
        decode_routes(big.index_fill(0, torch.tensor([0]), 63), "rank", (1, 3), 7)
    huge = encode_routes(torch.arange(128)[None], "rank", 256)  # C(256, 128) < 2^252: 252 one bits (the last
    # byte's 4 padding bits left zero) is not a rank
    with pytest.raises(RoutesError, match=r"a rank is >= C\(256, 128\)"):  # the multi-limb check
        decode_routes(torch.full_like(huge, 255).index_fill(0, torch.tensor([31]), 0x0f), "rank", (1, 128), 256)
    with pytest.raises(RoutesError, match="unknown routes codec"):
        decode_routes(big, "zstd", (1, 3), 7)
    with pytest.raises(RoutesError, match="duplicate"):
        encode_routes(torch.tensor([[1, 1]]), "rank", 8)
    with pytest.raises(RoutesError, match="out of range"):
        encode_routes(torch.tensor([[1, 8]]), "packed", 8)


def test_replay_output_does_not_depend_on_the_order_of_the_k_ids():
    """Set codecs return ids ascending, the engine records descending-prob order: replay must not care (fp32)."""
    model = build_model(CFG, 0).init_weights(0, std=0.2)
    ids = torch.randint(0, 14, (3, 9), generator=torch.Generator().manual_seed(1))
    _, routes = model(ids)
    flipped = routes.flip(-1)
    a, _ = model(ids, routes_BTLK=routes)
    b, _ = model(ids, routes_BTLK=flipped)
    assert (a - b).abs().max() < 1e-6  # equal up to float summation order


def rollout(seed=0):
    engine = Engine(build_model(CFG, seed).init_weights(seed, std=0.2), "bf16")
    return engine.generate([[1, 2, 3], [4, 5, 6, 7]], max_new_tokens=6, eos_ids=(14,), pad_id=15, group_size=2,
                           generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("codec", CODECS)
def test_save_load_round_trip_every_codec(tmp_path, codec):
    b = rollout()
    save_batch(b, str(tmp_path), codec=codec)
    got = load_batch(str(tmp_path))
    assert torch.equal(got.tokens, b.tokens) and torch.equal(got.rollout_logp, b.rollout_logp)
    want = b.routes.long().sort(-1).values if codec in SET_CODECS else b.routes.long()
    assert torch.equal(got.routes.long(), want)
    manifest = json.load(open(tmp_path / "manifest.json"))
    assert manifest["routes_codec"] == codec and manifest["routes_num_experts"] == CFG.num_experts


def test_decode_accepts_an_unaligned_payload():  # safetensors may hand back a view at any byte offset
    ids = random_routes(6, 8, 2)
    data = torch.cat([torch.zeros(1, dtype=torch.uint8), encode_routes(ids, "int32", 8)])[1:]
    assert torch.equal(decode_routes(data, "int32", (6, 2), 8).long(), ids)


def _rewrite(tmp_path, tensors=None, header=None):
    path = str(tmp_path / "batch.safetensors")
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        meta = dict(f.metadata())
    t = load_file(path)
    t.update(tensors or {})
    meta.update(header or {})
    save_file(t, path, metadata=meta)


def test_corrupt_files_are_refused(tmp_path):
    b = rollout()
    assert DEFAULT_FILE_CODEC == "rank"
    cases = [({"r3.routes_codec": "lz4"}, None, "unknown routes codec"),
             ({"r3.routes_shape": "[1, 2"}, None, "unreadable"),
             ({"r3.routes_shape": "[4, 8, 2, 2]"}, None, "does not match the manifest"),
             (None, lambda r: r[:-3], "bytes but needs exactly"),
             (None, lambda r: torch.full_like(r, 255), "rank|padding")]
    for header, payload, words in cases:
        save_batch(b, str(tmp_path))
        tensors = None if payload is None else {"routes": payload(load_file(str(tmp_path / "batch.safetensors"))
                                                                  ["routes"]).contiguous()}
        _rewrite(tmp_path, tensors, header)
        with pytest.raises(RoutesError, match=words):
            load_batch(str(tmp_path))


def test_load_rollouts_validates_and_names_the_bad_sample(tmp_path):
    b = rollout()
    for i in range(3):
        save_batch(b, str(tmp_path / f"step{i:03d}"))
    out = load_rollouts(str(tmp_path), CFG)
    assert len(out) == 3 and out[1].meta["source"].endswith("step001")
    assert torch.equal(load_rollouts(str(tmp_path / "step002"), CFG)[0].tokens, b.tokens)
    small = ModelConfig(**{**CFG.__dict__, "num_experts": 4})
    bad_row = int((b.routes >= 4).flatten(1).any(1).nonzero()[0, 0])
    with pytest.raises(RoutesError, match=f"step000: row {bad_row} .*out of range"):
        load_rollouts(str(tmp_path), small)
    with pytest.raises(RoutesError, match="3 layers"):
        load_rollouts(str(tmp_path), ModelConfig(**{**CFG.__dict__, "num_hidden_layers": 3}))
    b.routes = None
    save_batch(b, str(tmp_path / "step001"))
    with pytest.raises(RoutesError, match="step001: rows 0..3 have no routes"):
        load_rollouts(str(tmp_path), CFG)
    assert len(load_rollouts(str(tmp_path), CFG, require_routes=False)) == 3
    os.remove(tmp_path / "step002" / "batch.safetensors")
    with pytest.raises(FileNotFoundError, match="step002"):
        load_rollouts(str(tmp_path), CFG, require_routes=False)


def test_version_1_folders_with_raw_routes_still_load(tmp_path):
    b = rollout()
    tensors = {k: getattr(b, k).contiguous() for k in ("tokens", "attn_mask", "response_mask", "rollout_logp",
                                                       "rewards", "group")}
    save_file({**tensors, "routes": b.routes.contiguous()}, str(tmp_path / "batch.safetensors"))
    manifest = dict(format="r3-batch", version=1, num_rows=len(b), seq_len=b.tokens.shape[1], has_routes=True,
                    routes_shape=list(b.routes.shape), routes_dtype=str(b.routes.dtype), meta={})
    json.dump(manifest, open(tmp_path / "manifest.json", "w"))
    assert torch.equal(load_rollouts(str(tmp_path), CFG)[0].routes, b.routes)
