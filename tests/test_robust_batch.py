"""What this proves: a rollout folder is one checksummed unit (issue 10, classes 5, 6, 9, 10): a flipped bit in
routes or tokens, or an edited manifest, is refused naming the folder; every malformed field (shape, dtype, 0 rows,
pad ids, NaN rewards, NaN or positive log-probs, a response mask on padding, too long, another model's expert count,
a missing manifest field) is refused naming the folder and field; folders load in natural order."""
import json
import os
import shutil
import struct

import pytest
import torch

from r3.rollout.batch import load_batch, load_rollouts, save_batch
from r3.rollout.engine import Engine
from r3.model.model import ModelConfig, build_model
from r3.model.moe import RoutesError
from r3.model.routing import decode_routes

CFG = ModelConfig(vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)


def rollout(seed=0):
    engine = Engine(build_model(CFG, seed).init_weights(seed, std=0.2), "bf16")
    b = engine.generate([[1, 2, 3], [4, 5, 6, 7]], max_new_tokens=6, eos_ids=(14,), pad_id=15, group_size=2,
                        generator=torch.Generator().manual_seed(seed))
    b.rewards = torch.tensor([0.0, 1.0, 0.5, 0.25])
    return b


def tensor_span(path, name):
    """(offset, nbytes) of tensor `name`'s data in a safetensors file."""
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    s, e = json.loads(data[8:8 + n])[name]["data_offsets"]
    return 8 + n + s, e - s


def flip_bit(path, offset, bit):
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 1 << bit
    open(path, "wb").write(bytes(data))


def test_a_flipped_bit_that_decodes_to_other_valid_routes_is_refused(tmp_path):
    b = rollout()
    d = str(tmp_path / "ro")
    save_batch(b, d)
    path = os.path.join(d, "batch.safetensors")
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    off, n = tensor_span(path, "routes")
    payload = torch.frombuffer(bytearray(open(path, "rb").read()[off:off + n]), dtype=torch.uint8)
    shape, E = manifest["routes_shape"], manifest["routes_num_experts"]
    for i in range(n * 8):  # the first bit whose flip still decodes to valid expert sets: only a checksum sees it
        flipped = payload.clone()
        flipped[i // 8] ^= 1 << (i % 8)
        try:
            other = decode_routes(flipped, "rank", shape, E)
        except RoutesError:
            continue
        break
    assert not torch.equal(other, decode_routes(payload, "rank", shape, E))
    flip_bit(path, off + i // 8, i % 8)
    with pytest.raises(ValueError, match=f"{d}: checksum mismatch"):
        load_batch(d)
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_rollouts(str(tmp_path), CFG)


def test_a_flipped_token_bit_or_an_edited_manifest_is_refused(tmp_path):
    b = rollout()
    d = str(tmp_path / "ro")
    save_batch(b, d)
    off, _ = tensor_span(os.path.join(d, "batch.safetensors"), "tokens")
    flip_bit(os.path.join(d, "batch.safetensors"), off, 0)  # token 0 of row 0: still a valid id
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_batch(d)
    save_batch(b, d)
    m = json.load(open(os.path.join(d, "manifest.json")))
    m["meta"]["temperature"] = 0.7  # new numbers under an old manifest, or the reverse
    json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_batch(d)


def test_version_2_folders_without_a_checksum_load_with_a_warning(tmp_path):
    b = rollout()
    save_batch(b, str(tmp_path))
    m = json.load(open(tmp_path / "manifest.json"))
    del m["checksum"]
    m["version"] = 2
    json.dump(m, open(tmp_path / "manifest.json", "w"))
    with pytest.warns(UserWarning, match="no checksum"):
        assert torch.equal(load_batch(str(tmp_path)).tokens, b.tokens)
    m["version"] = 3  # a version-3 manifest must carry its checksum
    json.dump(m, open(tmp_path / "manifest.json", "w"))
    with pytest.raises(ValueError, match="missing field 'checksum'"):
        load_batch(str(tmp_path))


def _bad(name, fn):
    return pytest.param(fn, name, id=name)


def _set(field, fn):
    def apply(b):
        setattr(b, field, fn(getattr(b, field)))
    return apply


def _resp_pos(b):
    r, p = b.response_mask[:, 1:].nonzero()[0].tolist()
    return r, p


def _nan_logp(b):
    r, p = _resp_pos(b)
    b.rollout_logp[r, p] = float("nan")


def _pos_logp(b):
    r, p = _resp_pos(b)
    b.rollout_logp[r, p] = 0.5


def _resp_on_pad(b):
    r, p = (~b.attn_mask).nonzero()[0].tolist()
    b.response_mask[r, p] = True


def _pad_outside_vocab(b):
    b.tokens[~b.attn_mask] = 99


@pytest.mark.parametrize("mutate, words", [
    _bad("rewards dtype", _set("rewards", lambda t: t.double())),
    _bad("rewards shape", _set("rewards", lambda t: torch.cat([t, t]))),
    _bad("group dtype", _set("group", lambda t: t.float())),
    _bad("group shape", _set("group", lambda t: t[:2])),
    _bad("attn_mask dtype", _set("attn_mask", lambda t: t.long())),
    _bad("response_mask shape", _set("response_mask", lambda t: t[:, 1:])),
    _bad("rollout_logp shape", _set("rollout_logp", lambda t: torch.cat([t, t[:, :1]], 1))),
    _bad("rollout_logp dtype", _set("rollout_logp", lambda t: t.half())),
    _bad("NaN reward", _set("rewards", lambda t: t.index_fill(0, torch.tensor([2]), float("nan")))),
    _bad("NaN log-prob", _nan_logp),
    _bad("positive log-prob", _pos_logp),
    _bad("response mask on padding", _resp_on_pad),
    _bad("pad id outside the vocabulary", _pad_outside_vocab),
])
def test_malformed_fields_are_refused_naming_folder_and_field(tmp_path, mutate, words):
    b = rollout()
    mutate(b)
    field = words.split()[0] if words.split()[0] in b.__dict__ else None
    d = str(tmp_path / "step0")
    save_batch(b, d, num_experts=8)  # save writes what it is given: load must catch it
    want = {"NaN reward": "'rewards' row 2 is nan", "NaN log-prob": "'rollout_logp' row .* non-finite",
            "positive log-prob": "not a log-probability", "response mask on padding": "'response_mask' row .* padding",
            "pad id outside the vocabulary": "'tokens' row .*pad id 99"}.get(words, f"field '{field}'")
    with pytest.raises(ValueError, match=f"{d}: .*{want}"):
        load_rollouts(str(tmp_path), CFG)


def test_a_zero_row_batch_and_a_missing_manifest_field_are_refused(tmp_path):
    b = rollout()
    save_batch(b.select(slice(0, 0)), str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="empty: the batch has 0 rows"):
        load_rollouts(str(tmp_path / "empty"), CFG)
    save_batch(b, str(tmp_path / "ro"))
    m = json.load(open(tmp_path / "ro" / "manifest.json"))
    del m["seq_len"]
    json.dump(m, open(tmp_path / "ro" / "manifest.json", "w"))
    with pytest.raises(ValueError, match=r"ro/manifest.json: missing field 'seq_len'"):
        load_rollouts(str(tmp_path / "ro"), CFG)


def test_rollouts_from_another_model_are_refused(tmp_path):
    b = rollout()
    b.meta["num_experts"] = 16  # recorded on a 16-expert model; every id happens to be < 8
    save_batch(b, str(tmp_path / "a"), num_experts=16)
    with pytest.raises(RoutesError, match="a: routes were recorded on a model with 16 experts"):
        load_rollouts(str(tmp_path / "a"), CFG)
    del b.meta["num_experts"]  # no meta: the routes header still says 16
    save_batch(b, str(tmp_path / "b"), num_experts=16)
    with pytest.raises(RoutesError, match="b: routes were encoded for 16 experts"):
        load_rollouts(str(tmp_path / "b"), CFG)
    short = ModelConfig(**{**CFG.__dict__, "max_position_embeddings": 8})
    with pytest.raises(ValueError, match="exceed max_position_embeddings 8"):
        load_rollouts(str(tmp_path / "b"), short, require_routes=False)


def test_folders_load_in_natural_order_and_temp_copies_are_noted_or_refused(tmp_path, capsys):
    for i in (10, 2, 1, 3):
        b = rollout(i)
        b.meta["i"] = i
        save_batch(b, str(tmp_path / f"step{i}"))
    shutil.copytree(tmp_path / "step1", tmp_path / "step3.tmp")  # a killed rewrite of step3: step3 is whole
    os.makedirs(tmp_path / "step2.old")
    got = [os.path.basename(b.meta["source"]) for b in load_rollouts(str(tmp_path), CFG)]
    assert got == ["step1", "step2", "step3", "step10"]
    assert capsys.readouterr().err.count("note: skipping") == 2
    shutil.rmtree(tmp_path / "step3")  # a killed first write of step3: only step3.tmp is there, a step is missing
    with pytest.raises(ValueError, match=r"step3.tmp is a copy left by a killed write .*step3 does not exist"):
        load_rollouts(str(tmp_path), CFG)


def test_save_replaces_a_batch_folder_whole_and_refuses_other_folders(tmp_path):
    d = tmp_path / "ro"
    save_batch(rollout(0), str(d))
    (d / "summary.json").write_text("{}")
    save_batch(rollout(1), str(d))
    assert sorted(os.listdir(d)) == ["batch.safetensors", "manifest.json"]  # nothing of the old one left
    assert sorted(os.listdir(tmp_path)) == ["ro"]  # no temp copies either
    (d / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="refusing to replace .* other files"):
        save_batch(rollout(0), str(d))
