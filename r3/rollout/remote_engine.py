"""What every server engine shares: several servers, requests in chunks, seeding, weight sync to every server, checks.

A step's prompts are cut into chunks of `groups_per_request` GRPO groups (each prompt with its G samples). The chunks
go round-robin to the servers (each call, and each rank under torchrun, starts at the next server, so one-chunk calls
spread too), up to `inflight` per server at once, each with its own request ids and bounded retries
(`r3.rollout.remote_http`). Samples come back in the order sent, whatever server answered: with deterministic servers a
step's batch does not depend on how many servers there are.

Weights: `sync` writes the trainer's weights once, atomically, in HF layout to `weights_dir/policy` (a folder every
server can read: local disk on one node, a shared filesystem across nodes), then tells every server to load them,
concurrently, and checks each reply, and the weight version the server reports where it reports one. Every sample
that carries a weight version must carry the one pushed last: a server that missed an update is an error, never a
silently off-policy step. (A router in front of the servers is not needed, and is not relied on to fan updates out.)
Then every server scores a fixed probe and the trainer compares (`check_weights`, r3/rollout/sync_check.py): a server
that answered the load but serves other weights stops the run with one error naming it and the gap (`sync_check=
"warn"`: a warning instead). `last_sync` holds what the sync cost: bytes, write, load and check seconds, probe tokens.

Routes: with `require_routes` (R3 replays them) a sample without routes is refused; without it a server that sends
none is used, with one warning that route telemetry (router flips) is off.
Subclasses speak one protocol: `_chunk` (one request's samples), `_load_weights` (one server), `_score` (one
server's probe log-probs), `wait_ready`.
Left out: work stealing between servers (the round-robin split is static), NCCL weight transfer.
"""
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from r3.rollout.batch import Batch, batch_from_samples
from r3.rollout.engine_formats import EngineSample
from r3.rollout.sync_check import MODES, PRECISIONS, describe, precision, probe, read_scores, reference, verdict
from r3.scale.fsdp import gather_full_state_dict, is_distributed
from r3.scale.hf import CheckpointError, load_config, save_pretrained
from r3.runs.io import atomic_write
from r3.rollout.remote_http import RemoteEngineError, Server, log

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _rank() -> int:
    return torch.distributed.get_rank() if is_distributed() else 0


class RemoteEngine:
    """Shared HTTP, chunking, seeding, checks and weight writing; subclasses speak one server's protocol."""
    kind = "remote"
    max_groups_per_request: int | None = None  # a protocol's own limit (vLLM: one prompt per request)

    def __init__(self, urls, cfg, *, weights_dir: str | None = None, weights_dtype: torch.dtype = torch.bfloat16,
                 timeout: float = 3600.0, wait: float = 1800.0, retries: int = 3, groups_per_request: int = 4,
                 inflight: int = 16, sync_check: str = "error", require_routes: bool = True):
        if cfg.dense:
            raise ValueError("a remote engine returns routes for R3; the model config is dense")
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls or groups_per_request < 1 or inflight < 1:
            raise ValueError("a remote engine needs at least one server URL, groups_per_request >= 1, inflight >= 1")
        if sync_check not in MODES:
            raise ValueError(f"sync_check must be one of {MODES} (the check is never off), got {sync_check!r}")
        self.sync_check, self.require_routes = sync_check, require_routes
        self.last_check, self.warned_routes = [], False
        quiet = _rank() != 0
        self.servers = [Server(u, timeout=timeout, wait=wait, retries=retries, log=(lambda m: None) if quiet else log)
                        for u in urls]
        self.url, self.cfg = ",".join(s.url for s in self.servers), cfg
        self.weights_dir, self.weights_dtype = weights_dir, weights_dtype
        self.groups_per_request = min(groups_per_request, self.max_groups_per_request or groups_per_request)
        self.inflight = inflight
        self.syncs, self.calls, self.rollout_dtype, self.last_sync = 0, 0, None, {}
        self.version = None  # the weight version pushed to every server last (None: whatever they started with)

    @property
    def weights_path(self) -> str | None:
        return None if self.weights_dir is None else os.path.join(self.weights_dir, "policy")

    def wait_ready(self) -> None:
        for s in self.servers:
            s.wait_ready(progress=_rank() == 0)

    # ---- weights --------------------------------------------------------------------------------------------------
    def sync(self, model) -> None:
        """Write the trainer's weights in HF layout (`weights_dtype`) atomically to `weights_path`, then have every
        server load them. Under torchrun every rank calls this; rank 0 writes and posts, and a failure there is
        raised on every rank (never a silent step on stale weights)."""
        if self.weights_dir is None:
            raise RemoteEngineError(f"{self.kind} engine at {self.url}: weight sync needs weights_dir, a folder the "
                                    f"servers can read")
        sd = gather_full_state_dict(model, rank0_only=True)  # collective under FSDP
        err = None
        if _rank() == 0:
            try:
                t0 = time.perf_counter()
                atomic_write(self.weights_path,
                             lambda tmp: save_pretrained(model, tmp, state_dict=sd, dtype=self.weights_dtype))
                t1 = time.perf_counter()
                self._push(self.weights_path, str(self.syncs + 1))
                t2 = time.perf_counter()
                self.last_check = self.check_weights(sd)
                size = sum(e.stat().st_size for e in os.scandir(self.weights_path))
                self.last_sync = dict(bytes=size, write_s=t1 - t0, load_s=t2 - t1, check_s=time.perf_counter() - t2,
                                      check_tokens=sum(v["tokens"] for v in self.last_check),
                                      check_gap=max(v["gap"] for v in self.last_check),
                                      check_max_gap=max(v["max_gap"] for v in self.last_check))
                self._judge(self.last_check, str(self.syncs + 1))
            except Exception as e:  # noqa: BLE001 -- re-raised below, on every rank
                if not is_distributed():
                    raise
                err = f"{type(e).__name__}: {e}"
        if is_distributed():
            box = [err]
            torch.distributed.broadcast_object_list(box, src=0)
            if box[0] is not None:
                raise RemoteEngineError(f"weight sync failed on rank 0: {box[0]}")
        self.syncs += 1
        self.version = str(self.syncs)

    def _push(self, path: str, version: str) -> None:
        """Every server loads `path` as `version`, concurrently; all failures are reported together."""
        def one(server):
            try:
                self._load_weights(server, path, version)
                return None
            except RemoteEngineError as e:
                return str(e)
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            failed = [e for e in pool.map(one, self.servers) if e]
        if failed:
            raise RemoteEngineError(f"weight sync (version {version}): {len(failed)} of {len(self.servers)} "
                                    f"server(s) did not load {path}: " + " | ".join(failed))

    def _load_weights(self, server: Server, path: str, version: str) -> None:
        raise NotImplementedError

    def check_weights(self, state_dict: dict) -> list[dict]:
        """Every server scores the probe (concurrently) and is compared with the trainer's reference of
        `state_dict` (our names, as written) at the server's precision: one verdict per server
        (r3/rollout/sync_check.py). A server's precision is the dtype it reports, else `weights_dtype`'s."""
        seqs, refs, out = probe(self.cfg), {}, []
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            scored = list(pool.map(lambda s: (s, self._score(s, seqs)), self.servers))
        for server, values in scored:
            reported = self.server_dtype(server)
            prec = precision(self.weights_dtype) if reported is None else precision(reported)
            key = prec if prec in PRECISIONS else precision(self.weights_dtype) or "fp32"
            if key not in refs:
                refs[key] = reference(self.cfg, state_dict, key, seqs)
            try:
                got = read_scores(values, seqs, f"{server.url}: weight check")
            except ValueError as e:
                raise RemoteEngineError(str(e)) from e
            out.append(verdict(server.url, prec if reported is None or prec else reported, got, *refs[key]))
        return out

    def _judge(self, verdicts: list[dict], version: str) -> None:
        bad = [v for v in verdicts if v["ok"] is not True]
        if not bad:
            return
        msg = (f"weight sync (version {version}): {len(bad)} of {len(verdicts)} server(s) do not serve the weights "
               f"the trainer wrote: " + " | ".join(map(describe, bad)) + ". The server answered the load but serves "
               "other weights (vLLM 0.32 on CPU: its MoE reload bug, docs/servers.md), or computes at another "
               "precision than its weights'")
        if self.sync_check == "error":
            raise RemoteEngineError(msg + " (--sync-check warn only warns)")
        self.servers[0].log(f"warning: {msg} (--sync-check warn: the run goes on)")

    def server_dtype(self, server: Server) -> str | None:
        """The dtype a server reports it computes in, if it reports one (SGLang's /get_server_info)."""
        return None

    def _score(self, server: Server, seqs: list[list[int]]) -> list[list[float]]:
        """The server's log p(x_j | x_<j), j >= 1, of each probe sequence, read from its prompt log-probs."""
        raise NotImplementedError

    def check_version(self, served, where: str) -> None:
        """A sample's reported weight version must be the one pushed last (once the trainer has pushed any)."""
        if self.version is not None and served is not None and str(served) != self.version:
            raise RemoteEngineError(f"{where}: sampled with weight version {served!r}, but version {self.version!r} "
                                    f"was pushed to every server: this server missed a weight update")

    # ---- generation -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, eos_ids: tuple[int, ...], pad_id: int,
                 group_size: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None, keep_logp_V: bool = False) -> Batch:
        """Sample `group_size` responses per prompt on the servers; a Batch laid out as `Engine.generate` does.

        One seed per sample is drawn from `generator` (vLLM: per prompt, its children get seed + i), so a seeded run
        against deterministic servers is reproducible, with any number of servers. Servers return the sampled
        token's log-prob only: `keep_logp_V` is accepted for the in-process engine's signature, but no
        full-vocabulary log-probs come back (kl_full is None)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs at least one prompt and no empty prompt")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy, as SGLang and vLLM do it), got {temperature}")
        P, G, c = len(prompts), group_size, self.groups_per_request
        seeds = torch.randint(0, 2 ** 31 - 1, (P * G,), generator=generator).tolist()
        sp = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                  stop_token_ids=[int(t) for t in eos_ids])
        prompts = [[int(t) for t in p] for p in prompts]
        starts, S, offset = list(range(0, P, c)), len(self.servers), _rank() + self.calls
        self.calls += 1

        def run(k):
            a = starts[k]
            b = min(a + c, P)
            what = f"{b - a} prompts x {G} samples" + (f": prompts {a}-{b - 1} of {P}" if len(starts) > 1 else "")
            server = self.servers[(k + offset) % S]
            samples, name = self._chunk(server, prompts[a:b], seeds[a * G:b * G], G, sp, first=a, what=what)
            for j, s in enumerate(samples):
                self._check(s, f"{name}: sample {j} (prompt {a + j // G})", max_new_tokens, eos_ids)
            return samples
        t0 = time.perf_counter()
        pool = ThreadPoolExecutor(max_workers=min(len(starts), self.inflight * S))
        try:
            futures = [pool.submit(run, k) for k in range(len(starts))]
            samples = [s for f in futures for s in f.result()]
        finally:  # on a failure, requests not yet sent are dropped (those in flight end within their time-out)
            pool.shutdown(wait=True, cancel_futures=True)
        if any(s.routes is None for s in samples) and not self.warned_routes:
            self.warned_routes = True
            self.servers[0].log(f"warning: {self.kind} at {self.url} sends no routes: route telemetry (router flip "
                                f"rates) is off; R3 (--r3) would refuse these batches")
        meta = dict(engine=self.kind, server=self.url, rollout_dtype=self.rollout_dtype, group_size=G,
                    temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, weight_syncs=self.syncs,
                    weight_version=self.version, requests=len(starts), generate_s=time.perf_counter() - t0)
        return batch_from_samples(samples, self.cfg, pad_id=pad_id, meta=meta)

    def _chunk(self, server: Server, prompts, seeds, G: int, sp: dict, *, first: int,
               what: str) -> tuple[list[EngineSample], str]:
        """One request: G samples of each of `prompts` (prompt-major; the first is the call's prompt `first`), and
        the request's name for messages."""
        raise NotImplementedError

    def _check(self, s: EngineSample, where: str, max_new_tokens: int, eos_ids) -> None:
        n, V = len(s.output_ids), self.cfg.vocab_size
        if not 1 <= n <= max_new_tokens:
            raise RemoteEngineError(f"{where}: {n} output tokens, asked for 1..{max_new_tokens}")
        if any(not 0 <= t < V for t in s.output_ids):
            raise RemoteEngineError(f"{where}: output token ids outside the vocabulary [0, {V}): {s.output_ids}")
        stops = [j for j, t in enumerate(s.output_ids) if t in eos_ids]
        if stops and stops[0] != n - 1:
            raise RemoteEngineError(f"{where}: tokens after the stop token at {stops[0]} (of {n}): the server "
                                    f"ignored stop_token_ids")
        if s.output_logp is None or len(s.output_logp) != n:
            have = None if s.output_logp is None else len(s.output_logp)
            raise RemoteEngineError(f"{where}: {have} engine log-probs for {n} output tokens")
        if not torch.isfinite(torch.tensor(s.output_logp, dtype=torch.float64)).all():
            raise RemoteEngineError(f"{where}: non-finite engine log-probs {s.output_logp}")

    # ---- what the server serves -----------------------------------------------------------------------------------
    def served_config(self, server: Server, model_path) -> tuple[bool, torch.dtype | None]:
        """Where the server's model folder is readable here (one node, or a shared filesystem): refuse a model of
        another architecture at once. Returns (readable, the dtype its config.json names)."""
        if not isinstance(model_path, str) or not os.path.isfile(os.path.join(model_path, "config.json")):
            return False, None
        try:
            theirs, dtype = load_config(model_path)
        except (CheckpointError, OSError, ValueError) as e:
            server.log(f"note: {server.url} serves {model_path}, whose config.json cannot be read here ({e})")
            return False, None
        keys = ("num_hidden_layers", "num_experts", "num_experts_per_tok", "hidden_size", "vocab_size", "head_dim",
                "num_attention_heads", "num_key_value_heads", "moe_intermediate_size")
        diff = [f"{k} {getattr(theirs, k)} (trainer: {getattr(self.cfg, k)})" for k in keys
                if getattr(theirs, k) != getattr(self.cfg, k)]
        if diff:
            raise RemoteEngineError(f"{self.kind} server {server.url} serves {model_path}, another architecture than "
                                    f"the trainer's: {', '.join(diff)}")
        return True, dtype


def resolve_auto_dtype(config_dtype: torch.dtype | None) -> str:
    """SGLang's `--dtype auto` (srt/configs/model_config.py `_get_and_verify_dtype`): the config's dtype, except
    float32 checkpoints, which it serves in float16; a config without one counts as bfloat16."""
    if config_dtype is None:
        return "bfloat16"
    return "float16" if config_dtype == torch.float32 else _DTYPE_NAMES.get(config_dtype, str(config_dtype))
