"""The Batch: what the rollout engine hands to the trainer, in memory or on disk.

Layout (one row per sampled response; prompts left-padded, responses right-padded, one shared length T):
  tokens        [B, T]         long   prompt + response token ids
  attn_mask     [B, T]         bool   real tokens (False = padding)
  response_mask [B, T]         bool   response tokens (the EOS included)
  rollout_logp  [B, T-1]       f32    engine log-prob of tokens[:, p+1] at position p (0 off the response)
  routes        [B, T-1, L, K] int    experts the engine used for input position p (None: dense, or a server sent none)
  rewards       [B]            f32    task reward per response
  group         [B]            long   which prompt a row came from (GRPO groups)

Everything per token is indexed by *input position* p = 0..T-2, whose logits score token p+1. The engine feeds
exactly positions 0..T-2 (the last sampled token is never fed), so routes are [T-1, L, K] per sequence, the
same convention as SGLang's `routed_experts`. `loss_mask = response_mask[:, 1:]` selects the positions whose
target is a response token.

On disk: `batch.safetensors` (tensors) + `manifest.json` (shapes, model/engine metadata). No pickle.
Routes are stored encoded (`r3/model/routing.py`; default codec `rank`, the information limit for a top-k set): a flat
uint8 tensor `routes`, with the codec, shape and expert count in the safetensors header (`r3.routes_*` metadata) and
mirrored in the manifest. A set codec returns each row's ids ascending; replay does not depend on their order.
The folder is written as one unit (temp folder, fsync, rename: `r3.runs.io.atomic_write`), and the version-3 manifest
holds a SHA-256 of the content (`batch_digest`: every tensor, the routes header, the manifest itself), so a flipped
bit, a partial copy or an edited manifest is refused at load. Version-2 folders (no checksum) load with a warning;
version-1 folders (raw routes tensor) still load. `load_rollouts` reads one or many folders (natural order) and
validates every field against a model config (`r3/runs/validate.py`), naming the folder, field and row of anything that
does not fit. `batch_from_samples` builds a Batch from external-engine samples (SGLang / vLLM, see
`r3/rollout/engine_formats.py`).
"""
import hashlib
import json
import numbers
import os
import re
import sys
import warnings
from dataclasses import dataclass, field, fields

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from r3.rollout.engine_formats import EngineSample, routes_shaped, token_ids
from r3.errors import InputError, MissingInputError
from r3.runs.io import atomic_write
from r3.model.moe import RoutesError
from r3.model.routing import CODECS, DEFAULT_FILE_CODEC, decode_routes, encode_routes, \
    routes_dtype
from r3.runs.validate import check_batch_fields, check_batch_model

TENSORS = ("tokens", "attn_mask", "response_mask", "rollout_logp", "rewards", "group")
BATCH_FILES = ("batch.safetensors", "manifest.json", "summary.json")  # what a batch folder may hold


@dataclass
class Batch:
    tokens: torch.Tensor
    attn_mask: torch.Tensor
    response_mask: torch.Tensor
    rollout_logp: torch.Tensor
    routes: torch.Tensor | None
    rewards: torch.Tensor
    group: torch.Tensor
    rollout_logp_V: torch.Tensor | None = None  # [B, T-1, V] engine log-probs (tempered log-softmax) for kl_full
    meta: dict = field(default_factory=dict)

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.response_mask[:, 1:]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def select(self, idx) -> "Batch":
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in kw.items():
            if isinstance(v, torch.Tensor):
                kw[k] = v[idx]
        return Batch(**kw)


def _routes_num_experts(batch: Batch, num_experts: int | None) -> int:
    """E for the codec: the argument, else `meta["num_experts"]` (the engine records it), else max id + 1."""
    if num_experts is None:
        num_experts = batch.meta.get("num_experts")
    if num_experts is None:
        num_experts = int(batch.routes.max()) + 1 if batch.routes.numel() else batch.routes.shape[-1]
    return max(int(num_experts), batch.routes.shape[-1])


def batch_digest(tensors: dict[str, torch.Tensor], header: dict[str, str], manifest: dict) -> str:
    """SHA-256 over every stored tensor (name, dtype, shape, bytes; sorted by name), the safetensors header and the
    manifest (canonical JSON, without its `checksum`): what `save_batch` records and `load_batch` verifies."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        h.update(t.view(-1).view(torch.uint8).numpy())  # the buffer itself, no copy
    h.update(json.dumps(header, sort_keys=True).encode())
    h.update(json.dumps({k: v for k, v in manifest.items() if k != "checksum"}, sort_keys=True).encode())
    return "sha256:" + h.hexdigest()


def check_batch_target(out_dir: str) -> None:
    """Raise InputError unless `out_dir` can take a batch folder: absent, or a batch folder (replaced whole); not a
    file, not below a file, not a folder of other files. rollout.py calls it before any work."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"{out_dir!r} is a file; a rollout batch is a folder")
    parent = os.path.dirname(os.path.abspath(out_dir))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InputError(f"cannot write a rollout batch to {out_dir!r}: {parent} is a file")
    if os.path.isdir(out_dir):
        other = sorted(set(os.listdir(out_dir)) - {f + s for f in BATCH_FILES for s in ("", ".tmp", ".old")})
        if other:
            raise InputError(f"refusing to replace {out_dir!r} with a rollout batch: it holds other files {other[:5]}")


def save_batch(batch: Batch, out_dir: str, *, codec: str = DEFAULT_FILE_CODEC, num_experts: int | None = None) -> None:
    """Write the folder as one atomic unit: a temp folder with tensors + manifest, fsynced, renamed over `out_dir`.

    A SIGKILL at any point leaves the previous folder or the new one, never a mix. The manifest records a checksum
    of the content (`batch_digest`). Refuses to replace a folder that holds anything but a batch.
    """
    out_dir = out_dir.rstrip(os.sep)
    check_batch_target(out_dir)
    tensors = {k: getattr(batch, k).contiguous() for k in TENSORS}
    header, info = {}, dict(has_routes=batch.routes is not None, routes_shape=None, routes_codec=None)
    if batch.routes is not None:
        E = _routes_num_experts(batch, num_experts)
        tensors["routes"] = encode_routes(batch.routes, codec, E)
        info.update(routes_shape=list(batch.routes.shape), routes_codec=codec, routes_num_experts=E,
                    routes_nbytes=tensors["routes"].numel())
        header = {"r3.routes_codec": codec, "r3.routes_shape": json.dumps(info["routes_shape"]),
                  "r3.routes_num_experts": str(E)}
    manifest = dict(format="r3-batch", version=3, num_rows=len(batch), seq_len=batch.tokens.shape[1], **info,
                    meta=batch.meta)
    manifest = json.loads(json.dumps(manifest))  # as it will read back (e.g. int keys become strings)
    manifest["checksum"] = batch_digest(tensors, header, manifest)

    def write(tmp):
        os.makedirs(tmp)
        save_file(tensors, os.path.join(tmp, "batch.safetensors"), metadata=header)
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
    atomic_write(out_dir, write)


def _read_routes(tpath: str, payload: torch.Tensor, manifest: dict) -> torch.Tensor:
    """Decode the routes payload as its safetensors header says, refusing headers that disagree or do not parse."""
    if manifest.get("version", 1) == 1:  # raw id tensor, before codecs
        return payload
    header = _header(tpath)
    try:
        codec = header["r3.routes_codec"]
        shape = json.loads(header["r3.routes_shape"])
        E = int(header["r3.routes_num_experts"])
    except (KeyError, ValueError, TypeError) as e:
        raise RoutesError(f"{tpath}: routes header missing or unreadable ({e!r}); header = {header}") from e
    if codec not in CODECS:
        raise RoutesError(f"{tpath}: unknown routes codec {codec!r} in the header; known: {', '.join(CODECS)}")
    if (not isinstance(shape, list) or len(shape) != 4 or not all(isinstance(s, int) and s >= 0 for s in shape)
            or shape != manifest.get("routes_shape") or codec != manifest.get("routes_codec")):
        raise RoutesError(f"{tpath}: routes header (codec {codec!r}, shape {shape}) does not match the manifest "
                          f"(codec {manifest.get('routes_codec')!r}, shape {manifest.get('routes_shape')})")
    try:
        return decode_routes(payload, codec, tuple(shape), E)
    except RoutesError as e:
        raise RoutesError(f"{tpath}: {e}") from e


def _header(tpath: str) -> dict:
    with safe_open(tpath, "pt") as f:
        return f.metadata() or {}


def _read_manifest(in_dir: str) -> dict:
    mpath = os.path.join(in_dir, "manifest.json")
    try:
        with open(mpath, encoding="utf-8") as f:
            manifest = json.load(f)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise InputError(f"{mpath}: not valid JSON ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != "r3-batch":
        raise InputError(f"{mpath}: not an r3 rollout manifest")
    version = manifest.get("version", 1)
    if version not in (1, 2, 3):
        raise InputError(f"{mpath}: unsupported manifest version {version!r} (this code reads 1, 2, 3)")
    need = dict(num_rows=int, seq_len=int, has_routes=bool)
    if manifest.get("has_routes") and version >= 2:
        need.update(routes_shape=list, routes_codec=str)
    if version >= 3:
        need.update(checksum=str)
    for k, typ in need.items():
        if k not in manifest:
            raise InputError(f"{mpath}: missing field {k!r}")
        if not isinstance(manifest[k], typ) or (typ is int and isinstance(manifest[k], bool)):
            raise InputError(f"{mpath}: field {k!r} is {manifest[k]!r}, expected {typ.__name__}")
    if not isinstance(manifest.get("meta", {}), dict):
        raise InputError(f"{mpath}: field 'meta' must be an object")
    return manifest


def _missing_folder(in_dir: str) -> str:
    left = [p for p in (in_dir + ".tmp", in_dir + ".old") if os.path.exists(p)]
    hint = f" (a writer was killed mid-write: {left} hold(s) its temporary copies; rerun the writer)" if left else ""
    return f"rollout folder {in_dir!r} does not exist{hint}"


def _load(in_dir: str) -> tuple[Batch, dict]:
    in_dir = in_dir.rstrip(os.sep)
    if not os.path.isdir(in_dir):
        raise MissingInputError(_missing_folder(in_dir))
    mpath, tpath = os.path.join(in_dir, "manifest.json"), os.path.join(in_dir, "batch.safetensors")
    for p in (mpath, tpath):
        if not os.path.exists(p):
            raise MissingInputError(f"rollout folder {in_dir!r} has no {os.path.basename(p)}")
    manifest = _read_manifest(in_dir)
    try:
        t = load_file(tpath)
        header = _header(tpath)
    except Exception as e:  # safetensors raises its own error types for truncated or corrupt files
        raise InputError(f"{tpath}: corrupt or truncated safetensors file ({e})") from e
    missing = [k for k in TENSORS if k not in t]
    if missing:
        raise InputError(f"{tpath}: missing tensors {missing}")
    B, T = manifest["num_rows"], manifest["seq_len"]
    if tuple(t["tokens"].shape) != (B, T):
        raise InputError(f"{tpath}: tokens shape {tuple(t['tokens'].shape)} != manifest ({B}, {T})")
    routes = t.get("routes")
    if manifest["has_routes"]:
        if routes is None:
            raise RoutesError(f"{tpath}: manifest says routes were recorded but the file has none")
        routes = _read_routes(tpath, routes, manifest)
        if list(routes.shape) != manifest["routes_shape"] or routes.shape[:2] != (B, T - 1):
            raise RoutesError(f"{tpath}: routes shape {tuple(routes.shape)} does not match the manifest "
                              f"{manifest['routes_shape']} / tokens [{B}, {T}] (want [{B}, {T - 1}, L, K])")
    elif routes is not None:
        raise RoutesError(f"{tpath}: the file holds routes but the manifest says none were recorded")
    if manifest.get("version", 1) >= 3:
        if batch_digest(t, header, manifest) != manifest["checksum"]:
            raise InputError(f"{in_dir}: checksum mismatch: the content is not what save_batch wrote (a flipped bit, "
                             f"a partial copy or an edit); refusing it")
    else:
        warnings.warn(f"{in_dir}: a version-{manifest.get('version', 1)} rollout folder has no checksum, so its "
                      f"content cannot be verified (load and save_batch it again to add one)", stacklevel=3)
    b = Batch(routes=routes, meta=manifest.get("meta", {}), **{k: t[k] for k in TENSORS})
    check_batch_fields(b, in_dir)
    return b, manifest


def load_batch(in_dir: str) -> Batch:
    """Read a batch written by `save_batch`, refusing anything inconsistent with a message that names it.

    Checks: manifest fields, the file, the routes header, the checksum (version 3; older folders load with a
    warning), then every field's dtype, shape and range (`r3.runs.validate.check_batch_fields`).
    """
    return _load(in_dir)[0]


def _natural_key(path: str) -> list:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", path)]


def rollout_folders(path: str, *, notes: bool = True) -> list[str]:
    """`path` if it is a batch folder, else every batch folder below it in natural order (step2 before step10).

    A folder of steps must be whole. Refused, naming the folder: a step folder without manifest.json (it holds
    batch files or nothing: a lost manifest, a copy cut short), and a killed writer's temporary copy `stepN.tmp`
    with no `stepN` beside it (a step whose write never finished). A `*.tmp` / `*.old` beside a complete folder (a
    rewrite that was killed) is skipped with a one-line note on stderr. Folders holding other files are not steps.
    """
    path = path.rstrip(os.sep) or os.sep
    if os.path.exists(os.path.join(path, "manifest.json")):
        return [path]
    if not os.path.isdir(path):
        if os.path.exists(path):
            raise InputError(f"rollouts {path!r} is a file, not a rollout folder (or a folder of them)")
        raise MissingInputError(_missing_folder(path))
    dirs = []
    for root, sub, files in os.walk(path):
        for s in sorted(x for x in sub if x.endswith((".tmp", ".old"))):
            left, final = os.path.join(root, s), os.path.join(root, s[:-4])
            if not os.path.isdir(final):
                raise InputError(f"{left} is a copy left by a killed write (rollout.py?) and {final} does not "
                                 f"exist: a step is missing; rerun that rollout, or delete {left}")
            if notes:
                print(f"note: skipping {left}, left by a killed rewrite of {final}", file=sys.stderr)
        sub[:] = [s for s in sub if not s.endswith((".tmp", ".old"))]
        if "manifest.json" in files:
            dirs.append(root)
        elif root != path and not sub and (not files or set(files) & {"batch.safetensors", "summary.json"}):
            have = f"holds {sorted(files)} but" if files else "is empty and has"
            raise InputError(f"step folder {root} {have} no manifest.json: a step of {path} is missing or damaged; "
                             f"restore it (rerun rollout.py --out {root}) or remove the folder")
    if not dirs:
        raise MissingInputError(f"no rollout folders (with manifest.json) under {path!r}")
    return sorted(dirs, key=_natural_key)


def load_rollouts(path: str, cfg, *, require_routes: bool = True) -> list[Batch]:
    """Load one saved batch folder, or every batch folder below `path` (natural order), validated against `cfg`.

    cfg is a `ModelConfig`. Every field is checked (`load_batch`), then against the model
    (`r3.runs.validate.check_batch_model`): positions, vocabulary, and with `require_routes` (training with --r3) routes
    that fit: [rows, T-1, num_hidden_layers, num_experts_per_tok], ids in range, K distinct ids per (position, layer),
    recorded on a model with cfg.num_experts experts. Errors name the folder, field and row.
    Each Batch gets `meta["source"] = folder`.
    """
    dirs = rollout_folders(path)
    if require_routes and cfg.dense:
        raise RoutesError("routes cannot be replayed into a dense model (cfg.dense=True); drop --r3")
    out = []
    for d in dirs:
        b, manifest = _load(d)
        check_batch_model(b, cfg, d, require_routes=require_routes, num_experts=manifest.get("routes_num_experts"))
        b.meta["source"] = d
        out.append(b)
    return out


def batch_from_samples(samples: list[EngineSample], cfg, *, pad_id: int, meta: dict | None = None) -> Batch:
    """Lay engine samples out as our Batch (prompts left padded, outputs right padded), as Engine.generate does.

    Positions without a token get the distinct dummy ids 0..K-1 (outside loss_mask). rollout_logp is 0 where the
    engine gave no log-probs (meta["rollout_logp_missing"] lists those rows). The result is checked exactly as a
    saved folder is at load (`check_batch_fields`, `check_batch_model`): errors name the field, row (= sample index)
    and position, and nothing a saved folder would refuse is returned.
    """
    if not isinstance(samples, (list, tuple)) or not samples:
        raise InputError(f"batch_from_samples needs a non-empty list of EngineSample, got {samples!r:.80}")
    samples = [_checked_sample(s, cfg, f"batch_from_samples: sample {i}") for i, s in enumerate(samples)]
    B, K = len(samples), cfg.num_experts_per_tok
    missing_routes = [i for i, s in enumerate(samples) if s.routes is None]
    if 0 < len(missing_routes) < B:
        raise InputError(f"batch_from_samples: sample {missing_routes[0]} has no routes but others have: "
                         f"{len(missing_routes)} of {B} without (one server without --enable-return-routed-experts?)")
    Lp, N = max(len(s.prompt_ids) for s in samples), max(len(s.output_ids) for s in samples)
    T = Lp + N
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros(B, T, dtype=torch.bool)
    resp = torch.zeros(B, T, dtype=torch.bool)
    logp = torch.zeros(B, T - 1)
    routes = torch.arange(K).expand(B, T - 1, cfg.num_hidden_layers, K).clone()
    missing = []
    for i, s in enumerate(samples):
        p, n = len(s.prompt_ids), len(s.output_ids)
        o = Lp - p
        where = f"sample {i}"
        if n == 0:
            raise InputError(f"{where}: no output tokens")
        tokens[i, o:Lp + n] = torch.tensor(s.prompt_ids + s.output_ids)
        attn[i, o:Lp + n] = True
        resp[i, Lp:Lp + n] = True
        if s.routes is not None:
            routes[i, o:o + p + n - 1] = s.routes
        if s.output_logp is None:
            missing.append(i)
        elif len(s.output_logp) != n:
            raise InputError(f"{where}: {len(s.output_logp)} log-probs for {n} output tokens")
        else:
            logp[i, Lp - 1:Lp - 1 + n] = torch.tensor(s.output_logp)
    if meta is not None and not isinstance(meta, dict):
        raise InputError(f"batch_from_samples: meta is {type(meta).__name__}, expected a dict")
    meta = dict(meta or {}, prompt_len=Lp, num_experts=cfg.num_experts, rollout_logp_missing=missing)
    b = Batch(tokens=tokens, attn_mask=attn, response_mask=resp, rollout_logp=logp,
              routes=None if missing_routes else routes.to(routes_dtype(cfg.num_experts)),
              rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
              group=torch.tensor([s.group for s in samples], dtype=torch.long), meta=meta)
    check_batch_fields(b, "batch_from_samples")
    check_batch_model(b, cfg, "batch_from_samples", require_routes=not missing_routes)
    return b


def _checked_sample(s, cfg, where: str) -> EngineSample:
    """The sample with its fields in the types the layout needs (ids as lists of ints, routes [n - 1, L, K] int64,
    a float reward, an int group); InputError naming the sample and field of anything else."""
    for name in ("prompt_ids", "output_ids", "routes", "output_logp", "reward", "group"):
        if not hasattr(s, name):
            raise InputError(f"{where} is a {type(s).__name__} without {name!r}, expected an EngineSample")
    prompt, out = token_ids(s.prompt_ids, f"{where}: prompt_ids"), token_ids(s.output_ids, f"{where}: output_ids")
    logp = None
    if s.output_logp is not None:
        if not isinstance(s.output_logp, (list, tuple, torch.Tensor)):
            raise InputError(f"{where}: output_logp is a {type(s.output_logp).__name__}, expected a list or None")
        logp = [float(x) if isinstance(x, torch.Tensor) else x for x in s.output_logp]
        bad = [j for j, x in enumerate(logp) if isinstance(x, bool) or not isinstance(x, numbers.Real)]
        if bad:
            raise InputError(f"{where}: output_logp[{bad[0]}] is {logp[bad[0]]!r}, not a number")
    for name, typ in (("reward", numbers.Real), ("group", numbers.Integral)):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, typ):
            raise InputError(f"{where}: {name} is {v!r}, expected {'a number' if name == 'reward' else 'an int'}")
    routes = None if s.routes is None else routes_shaped(s.routes, cfg, len(prompt) + len(out), where)
    return EngineSample(prompt, out, routes, logp, float(s.reward), int(s.group))
