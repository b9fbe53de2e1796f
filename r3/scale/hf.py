"""HF Qwen3-MoE checkpoints in and out: config.json → `ModelConfig`, safetensors shards → `Transformer`, and back.

The whole weight mapping is the table `KEY_MAP` below. Our parameter names are HF's, so every key maps to itself
except the experts: HF stores one tensor per expert (`model.layers.{L}.mlp.experts.{e}.gate_proj.weight`, as on the
Hub and as transformers 4.x and 5.x both write to disk), we stack a layer's experts into [E, ., .]. transformers
5.x fuses gate and up *in memory* (`mlp.experts.gate_up_proj` [E, 2I, D]); files in that layout load too.

Loading builds the model on the `meta` device, streams the shards one tensor at a time into tensors of the final
dtype/device, then `load_state_dict(strict=True, assign=True)`: peak host memory is the model plus one tensor,
never the model twice. Anything off (missing or unexpected key, wrong shape, a tensor that is not float or holds a
NaN / inf, unreadable shard, an architecture feature we do not implement) raises `CheckpointError` naming it.

`save_pretrained` writes HF layout: config.json in transformers-4.x names (5.x reads them too), per-expert keys,
shards of at most `max_shard_size` bytes plus `model.safetensors.index.json`.

The tokenizer comes from `tokenizer.json` (the `tokenizers` package, no transformers at run time) with a minimal
ChatML template; EOS ids come from generation_config.json / tokenizer_config.json, else Qwen3's {151645, 151643}.

Left out on purpose: sliding-window attention, dense layers (`mlp_only_layers`, `decoder_sparse_step`), tied
embeddings, RoPE scaling, attention bias: the loader refuses such checkpoints rather than load them wrongly.
"""
import json
import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from r3.errors import InputError
from r3.runs.io import read_json_object
from r3.model.model import ModelConfig, Transformer
from r3.runs.validate import check_model_config, check_weight


class CheckpointError(InputError):
    """A checkpoint we cannot load as it is. The message names the file, key or config field."""


ARCHITECTURE = "Qwen3MoeForCausalLM"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# HF key (regex) → our key (template), and how the tensor is placed:
#   whole    the tensor is our parameter
#   expert   the tensor is slot {e} of our stacked [E, ., .] parameter
#   gate_up  transformers 5.x fused [E, 2I, D]: first I rows → gate_proj, last I rows → up_proj
KEY_MAP = (
    (r"model\.layers\.(?P<L>\d+)\.mlp\.experts\.(?P<e>\d+)\.(?P<p>gate|up|down)_proj\.weight",
     "model.layers.{L}.mlp.experts.{p}_proj", "expert"),
    (r"model\.layers\.(?P<L>\d+)\.mlp\.experts\.gate_up_proj", "model.layers.{L}.mlp.experts.{p}_proj", "gate_up"),
    (r"(?P<k>.+)", "{k}", "whole"),
)
_RULES = [(re.compile(p + r"\Z"), t, how) for p, t, how in KEY_MAP]
_OURS_EXPERT = re.compile(r"model\.layers\.(?P<L>\d+)\.mlp\.experts\.(?P<p>gate|up|down)_proj\Z")


def placements(hf_key: str, t: torch.Tensor) -> list[tuple[str, int | None, torch.Tensor]]:
    """Where one HF tensor goes: [(our key, expert slot or None for the whole tensor, tensor)]."""
    for rx, template, how in _RULES:
        m = rx.match(hf_key)
        if m is None:
            continue
        g = m.groupdict()
        if how == "whole":
            return [(template.format(**g), None, t)]
        if how == "expert":
            return [(template.format(**g), int(g["e"]), t)]
        if t.dim() != 3 or t.shape[1] % 2:
            raise CheckpointError(f"fused key {hf_key!r} has shape {tuple(t.shape)}; expected [E, 2·I, D]")
        gate, up = t.chunk(2, dim=1)
        return [(template.format(p="gate", **g), None, gate), (template.format(p="up", **g), None, up)]
    raise AssertionError("the last KEY_MAP rule matches every key")


def hf_items(name: str, t: torch.Tensor):
    """Our parameter → HF on-disk (key, tensor) pairs: the inverse of the `expert` rule, identity otherwise."""
    m = _OURS_EXPERT.match(name)
    if m is None:
        yield name, t
        return
    for e in range(t.shape[0]):
        yield f"model.layers.{m['L']}.mlp.experts.{e}.{m['p']}_proj.weight", t[e]


# ---------------------------------------------------------------------------------------------------------- config

def read_json(path: str) -> dict:
    """A JSON object from `path`; CheckpointError naming the file (and line / column) when it is not one."""
    return read_json_object(path, CheckpointError)


def _get(raw: dict, *names, default=None):
    for n in names:
        if raw.get(n) is not None:
            return raw[n]
    return default


def config_from_hf(raw: dict, where: str = "config.json") -> tuple[ModelConfig, torch.dtype | None]:
    """Our `ModelConfig` (and the stored dtype, if named) from a Qwen3-MoE config.json dict, 4.x or 5.x names."""
    archs = raw.get("architectures") or [ARCHITECTURE]
    if archs != [ARCHITECTURE]:
        raise CheckpointError(f"{where}: architectures={archs}; only {ARCHITECTURE} is supported")
    unsupported = [  # (field, is it set to something we do not implement?)
        ("mlp_only_layers", bool(raw.get("mlp_only_layers"))),
        ("decoder_sparse_step", raw.get("decoder_sparse_step", 1) != 1),
        ("tie_word_embeddings", bool(raw.get("tie_word_embeddings", False))),
        ("use_sliding_window", bool(raw.get("use_sliding_window", False))),
        ("attention_bias", bool(raw.get("attention_bias", False))),
        ("hidden_act", raw.get("hidden_act", "silu") != "silu"),
        ("rope_scaling", raw.get("rope_scaling") is not None),
        ("rope_parameters.rope_type", (raw.get("rope_parameters") or {}).get("rope_type", "default") != "default"),
    ]
    for name, bad in unsupported:
        if bad:
            top = name.split(".")[0]
            raise CheckpointError(f"{where}: unsupported {name}={raw.get(top)!r} (this model implements only the "
                                  f"Qwen3-30B-A3B architecture: every layer sparse, untied, no sliding window)")
    rope_theta = _get(raw, "rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta")
    num_experts = _get(raw, "num_experts", "num_local_experts")
    required = dict(vocab_size=raw.get("vocab_size"), hidden_size=raw.get("hidden_size"),
                    num_hidden_layers=raw.get("num_hidden_layers"), num_attention_heads=raw.get("num_attention_heads"),
                    moe_intermediate_size=raw.get("moe_intermediate_size"), num_experts=num_experts,
                    num_experts_per_tok=raw.get("num_experts_per_tok"), rope_theta=rope_theta)
    missing = [k for k, v in required.items() if v is None]
    if missing:
        raise CheckpointError(f"{where}: missing fields {missing} (num_experts may be num_local_experts; "
                              f"rope_theta may be rope_parameters.rope_theta)")
    optional = dict(num_key_value_heads=raw.get("num_key_value_heads"), head_dim=raw.get("head_dim"),
                    max_position_embeddings=raw.get("max_position_embeddings"))
    for k, v in {**required, **optional}.items():
        if v is not None and k != "rope_theta" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise CheckpointError(f"{where}: {k}={v!r} must be a positive integer")
    H = raw["num_attention_heads"]
    cfg = ModelConfig(
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"], num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=H, num_key_value_heads=_get(raw, "num_key_value_heads", default=H),
        head_dim=_get(raw, "head_dim", default=raw["hidden_size"] // H),
        moe_intermediate_size=raw["moe_intermediate_size"], num_experts=num_experts,
        num_experts_per_tok=raw["num_experts_per_tok"],
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),  # the HF class default is False
        rope_theta=_float(rope_theta, "rope_theta", where),
        rms_norm_eps=_float(_get(raw, "rms_norm_eps", default=1e-6), "rms_norm_eps", where),
        max_position_embeddings=_get(raw, "max_position_embeddings", default=32768))
    try:
        check_model_config(cfg, where)  # e.g. num_experts_per_tok > num_experts: refused here, not at a forward
    except ValueError as e:
        raise CheckpointError(str(e)) from e
    name = _get(raw, "dtype", "torch_dtype")
    return cfg, DTYPES.get(name) if isinstance(name, str) else None


def _float(v, name: str, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CheckpointError(f"{where}: {name}={v!r} must be a number")
    return float(v)


def config_to_hf(cfg: ModelConfig, dtype: torch.dtype) -> dict:
    """config.json in transformers-4.x names (`num_experts`, `rope_theta`, `torch_dtype`); 5.x maps them itself."""
    if cfg.dense:
        raise CheckpointError("the dense twin is not a Qwen3MoeForCausalLM; save_pretrained writes MoE models only")
    dtype_name = {v: k for k, v in DTYPES.items()}[dtype]
    return dict(architectures=[ARCHITECTURE], model_type="qwen3_moe", vocab_size=cfg.vocab_size,
                hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
                num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                head_dim=cfg.head_dim, moe_intermediate_size=cfg.moe_intermediate_size,
                intermediate_size=cfg.dense_intermediate_size, num_experts=cfg.num_experts,
                num_experts_per_tok=cfg.num_experts_per_tok, norm_topk_prob=cfg.norm_topk_prob,
                rope_theta=cfg.rope_theta, rope_scaling=None, rms_norm_eps=cfg.rms_norm_eps,
                max_position_embeddings=cfg.max_position_embeddings, hidden_act="silu", attention_bias=False,
                tie_word_embeddings=False, use_sliding_window=False, sliding_window=None, decoder_sparse_step=1,
                mlp_only_layers=[], torch_dtype=dtype_name)


def load_config(path: str) -> tuple[ModelConfig, torch.dtype | None]:
    where = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise CheckpointError(f"model folder {path!r} " + ("is a file" if os.path.exists(path) else "does not exist"))
    if not os.path.exists(where):
        raise CheckpointError(f"{path!r} has no config.json: not an HF checkpoint folder")
    return config_from_hf(read_json(where), where)


# --------------------------------------------------------------------------------------------------------- weights

def shard_files(path: str) -> list[str]:
    """The safetensors files of a checkpoint, from the index when there is one."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        weight_map = read_json(index).get("weight_map")
        if not weight_map or not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no weight_map object")
        bad = [k for k, v in weight_map.items() if not isinstance(v, str)]
        if bad:
            raise CheckpointError(f"{index}: weight_map[{bad[0]!r}] is {weight_map[bad[0]]!r}, not a file name")
        files = sorted(set(weight_map.values()))
        for fn in files:
            if not os.path.exists(os.path.join(path, fn)):
                raise CheckpointError(f"{index} lists shard {fn!r}, which does not exist")
        return [os.path.join(path, fn) for fn in files]
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(single):
        return [single]
    raise CheckpointError(f"{path!r} has neither model.safetensors.index.json nor model.safetensors")


def read_state_dict(path: str, model: Transformer, *, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Stream every shard into a complete state dict in our names, checked against `model`'s shapes (meta is fine).

    Each tensor is read, cast and placed before the next is read, so host memory peaks near one tensor beyond the
    result. Raises CheckpointError naming the key on anything missing, unexpected or mis-shaped.
    """
    want = {k: v.shape for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    filled: dict[str, torch.Tensor] = {}  # per our key: which expert slots (or [whole]) have been written
    for fn in shard_files(path):
        try:  # safetensors raises its own error types for truncated / corrupt files
            f = safe_open(fn, framework="pt", device="cpu")
            keys = list(f.keys())
        except Exception as e:
            raise CheckpointError(f"{fn}: corrupt or truncated safetensors shard ({type(e).__name__}: {e})") from e
        for hf_key in keys:
            try:
                t = f.get_tensor(hf_key)
            except Exception as e:
                raise CheckpointError(f"{fn}: corrupt or truncated safetensors shard: cannot read {hf_key!r} "
                                      f"({type(e).__name__}: {e})") from e
            _place(hf_key, t, want, out, filled, dtype, device, fn)
        del f
    missing = [_hf_name(k, None) for k in want if k not in filled]
    missing += [_hf_name(k, e) for k, m in filled.items() for e in (~m).nonzero()[:, 0].tolist()]
    if missing:
        raise CheckpointError(f"{path}: {len(missing)} missing keys, e.g. {missing[:5]}")
    return out


def _hf_name(key: str, slot: int | None) -> str:
    """The HF on-disk name of our `key` (expert `slot` of it; None = expert 0, or the key itself if not experts)."""
    m = _OURS_EXPERT.match(key)
    return key if m is None else f"model.layers.{m['L']}.mlp.experts.{slot or 0}.{m['p']}_proj.weight"


def _place(hf_key, t, want, out, filled, dtype, device, fn):
    for key, slot, x in placements(hf_key, t):
        if key not in want:
            raise CheckpointError(f"{fn}: unexpected key {hf_key!r} (no parameter {key!r} in the model)")
        shape = want[key]
        E = shape[0] if slot is not None else 1
        if slot is not None and not 0 <= slot < E:
            raise CheckpointError(f"{fn}: unexpected key {hf_key!r}: expert {slot} but the config has {E} experts")
        expect = shape[1:] if slot is not None else shape
        if tuple(x.shape) != tuple(expect):
            raise CheckpointError(f"{fn}: {hf_key!r} has shape {tuple(x.shape)}, the model needs {tuple(expect)}")
        check_weight(x, hf_key, fn, CheckpointError)  # before the cast: an int would become a float silently
        if key not in out:
            if slot is None:
                out[key] = x.to(device=device, dtype=dtype).contiguous()
            else:
                out[key] = torch.empty(shape, dtype=dtype, device=device)
            filled[key] = torch.zeros(E, dtype=torch.bool)
        elif slot is None or filled[key][slot]:
            raise CheckpointError(f"{fn}: duplicate key {hf_key!r}")
        if slot is not None:
            out[key][slot].copy_(x)
            filled[key][slot] = True
        else:
            filled[key][:] = True


def load_pretrained(path: str, *, dtype: torch.dtype | None = None,
                    device: torch.device | str = "cpu") -> Transformer:
    """Our `Transformer` with the weights of an HF Qwen3-MoE checkpoint folder.

    dtype: None = the dtype config.json names (`dtype` / `torch_dtype`), else float32.
    """
    cfg, stored = load_config(path)
    dtype = dtype or stored or torch.float32
    with torch.device("meta"):
        model = Transformer(cfg)
    sd = read_state_dict(path, model, dtype=dtype, device=device)
    model.load_state_dict(sd, strict=True, assign=True)
    return model


def save_pretrained(model: Transformer, path: str, *, max_shard_size: int | str = "5GB",
                    state_dict: dict | None = None, dtype: torch.dtype | None = None) -> None:
    """Write an HF-layout checkpoint (config.json, shards, index) that `Qwen3MoeForCausalLM.from_pretrained` reads.

    state_dict: our-named full tensors to write instead of `model`'s own (e.g. gathered from FSDP on rank 0).
    dtype: cast each tensor as it is written (e.g. bf16 from fp32 master weights); None keeps it.
    """
    sd = model.state_dict() if state_dict is None else state_dict
    dtype = dtype or next(iter(sd.values())).dtype
    limit = _parse_size(max_shard_size)
    os.makedirs(path, exist_ok=True)
    shards, cur, size = [], {}, 0
    for name, t in sd.items():
        for key, x in hf_items(name, t):
            n = x.numel() * dtype.itemsize
            if cur and size + n > limit:
                shards.append(cur)
                cur, size = {}, 0
            cur[key] = x.detach().to(device="cpu", dtype=dtype).contiguous()
            size += n
    shards.append(cur)
    total = sum(x.numel() * x.element_size() for s in shards for x in s.values())
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for fn, shard in zip(names, shards):
        save_file(shard, os.path.join(path, fn), metadata={"format": "pt"})
    if len(shards) > 1:
        index = dict(metadata=dict(total_size=total),
                     weight_map={k: fn for fn, s in zip(names, shards) for k in s})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_to_hf(model.cfg, dtype), f, indent=2)


def _parse_size(s: int | str) -> int:
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?I?B)\s*", s.upper())
    if m is None:
        raise ValueError(f"max_shard_size {s!r}: use an int of bytes or e.g. '5GB', '500MB', '20KB'")
    unit = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[m[2]]
    return int(float(m[1]) * unit)


# ------------------------------------------------------------------------------------------------------- tokenizer

QWEN_EOS_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>


class Tokenizer:
    """`tokenizer.json` via the `tokenizers` package, a minimal ChatML template, and the checkpoint's EOS ids."""

    def __init__(self, tok, eos_ids: tuple[int, ...], pad_id: int):
        self.tok, self.eos_ids, self.pad_id = tok, eos_ids, pad_id

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @staticmethod
    def chat(prompt: str) -> str:
        """One user turn, then the assistant's turn opened (Qwen's ChatML, no system prompt, no thinking tags)."""
        return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"

    def encode_chat(self, prompt: str) -> list[int]:
        return self.encode(self.chat(prompt))


def load_tokenizer(path: str) -> Tokenizer:
    """Tokenizer of a checkpoint folder. EOS ids: generation_config.json `eos_token_id` plus tokenizer_config.json
    `eos_token`; Qwen3's (151645, 151643) when neither file names one. Pad: `pad_token`, else the first EOS."""
    from tokenizers import Tokenizer as HFTokenizer
    fn = os.path.join(path, "tokenizer.json")
    if not os.path.exists(fn):
        raise CheckpointError(f"{path!r} has no tokenizer.json")
    try:
        tok = HFTokenizer.from_file(fn)
    except Exception as e:  # the tokenizers package raises a bare Exception with no file name
        raise CheckpointError(f"{fn}: cannot be read as a tokenizer ({e})") from e

    def read(name):
        p = os.path.join(path, name)
        return read_json(p) if os.path.exists(p) else {}

    def token_id(t, field):  # tokenizer_config stores tokens as strings or as {"content": ...}
        t = t.get("content") if isinstance(t, dict) else t
        if t is not None and not isinstance(t, str):
            raise CheckpointError(f"{os.path.join(path, 'tokenizer_config.json')}: {field}={t!r} is not a token")
        return None if t is None else tok.token_to_id(t)

    gen, tcfg = read("generation_config.json"), read("tokenizer_config.json")
    eos = gen.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else eos
    if not isinstance(eos, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in eos):
        raise CheckpointError(f"{os.path.join(path, 'generation_config.json')}: eos_token_id="
                              f"{gen.get('eos_token_id')!r} must be a token id or a list of them")
    eos_tok = token_id(tcfg.get("eos_token"), "eos_token")
    if eos_tok is not None and eos_tok not in eos:
        eos.append(eos_tok)
    eos = tuple(eos) or QWEN_EOS_IDS
    pad = token_id(tcfg.get("pad_token"), "pad_token")
    return Tokenizer(tok, eos, eos[0] if pad is None else pad)
