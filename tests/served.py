"""Test helpers (no tests here): run `python -m r3.serve` as subprocesses or the same server on a thread, on free
localhost ports, and read what a server saw (/r3_debug/stats)."""
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from r3.tools.serve import Handler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the toy preset at its own 16-token vocabulary (the sort task), random init, fp32: the tests' model is PRESETS["toy"]
SMALL = ["--task", "sort", "--warmup-steps", "0", "--rollout-dtype", "fp32"]
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A `python -m r3.serve` subprocess; `url` once `ready()` read its ready line."""

    def __init__(self, *args, cwd=ROOT):
        self.proc = subprocess.Popen([sys.executable, "-m", "r3.serve", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd)
        self.url = None

    def ready(self) -> "Served":
        line = self.proc.stdout.readline()
        if "ready on" not in line:
            self.stop()
            raise RuntimeError(f"r3.serve did not start: {line!r} {self.proc.stderr.read()}")
        self.url = line.split()[-1]
        return self

    def stats(self) -> dict:
        return get_json(self.url + "/r3_debug/stats")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def serving(*args, cwd=ROOT, n: int = 1):
    """One server (or a list of `n`, started together) with these flags, stopped on exit."""
    started = [Served(*args, cwd=cwd) for _ in range(n)]
    try:
        ready = [s.ready() for s in started]
        yield ready[0] if n == 1 else ready
    finally:
        for s in started:
            s.stop()


@contextlib.contextmanager
def on_thread(state, port: int = 0):
    """r3.serve's handler over `state` (an `SGLangStandIn`) on a thread in this process: (url, state)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads, httpd.state, httpd.verbose = True, state, False
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def get_json(url: str):
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory):
    """`python -m r3.serve` (SGLang's protocol, our fp32 toy engine) on a free localhost port: (url, weights root)."""
    root = tmp_path_factory.mktemp("served")
    with serving(*SMALL, "--port", "0", "--weights-root", str(root)) as s:
        yield s.url, root
