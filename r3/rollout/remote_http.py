"""HTTP to one inference server (standard library only): JSON exchanges, the start-up wait, bounded retries.

    server = Server("http://10.0.0.5:30000", timeout=3600, wait=1800, retries=3)
    server.wait_ready()                                   # GET /health until 200, with a progress line
    out = server.call("POST", "/generate", body, what="4 prompts x 8 samples", on_timeout=abort)

What is waited out, what is retried, what ends a call at once:
  start-up  `wait_ready` waits up to `wait` seconds through refused connections, HTTP 503 and time-outs (neither
            SGLang nor vLLM opens its port before the model is loaded; both answer /health 503 while starting),
            printing a progress line every 30 s. Any other answer (a 4xx, a 500) ends it at once.
  a call    `call` retries `retries` times, 1, 2, 4, ... s apart, on what may pass: a refused connection, HTTP 503,
            a connection reset mid-answer, a time-out (after `on_timeout`, e.g. SGLang's /abort_request, so the
            server stops computing an answer nobody will read). An answer that will not change (any other HTTP
            error, a body that is not JSON) is raised at once.
Every failure is a `RemoteEngineError` naming the request (method, URL, what was asked) and quoting the server.
Left out: TLS client certificates, auth headers, streaming, connection pools (one connection per request).
"""
import json
import socket
import sys
import time
import urllib.error
import urllib.request

from r3.errors import InputError

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost must not go through a proxy
PROGRESS_EVERY = 30.0  # seconds between "still waiting" lines


class RemoteEngineError(InputError, RuntimeError):
    """A request to an inference server failed or got an unusable answer. `status`: the HTTP status, if any;
    `retryable`: the failure may pass (refused, 503, reset, time-out); `timed_out`: no answer in time."""

    def __init__(self, msg: str, status: int | None = None, *, retryable: bool = False, timed_out: bool = False,
                 reason: str = ""):
        super().__init__(msg)
        self.status, self.retryable, self.timed_out, self.reason = status, retryable, timed_out, reason or msg


def server_message(obj, raw: bytes) -> str:
    """The error text SGLang / vLLM / FastAPI put in an error body, else the body itself (truncated)."""
    if isinstance(obj, dict):
        err = obj.get("error")
        for m in ((err.get("message") if isinstance(err, dict) else err), obj.get("message"), obj.get("detail")):
            if m:
                return str(m)
    return raw[:300].decode("utf-8", "replace")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Server:
    """One server at `url`: `timeout` seconds per request, `wait` seconds at start-up, `retries` per call."""

    def __init__(self, url: str, *, timeout: float = 3600.0, wait: float = 1800.0, retries: int = 3, log=log):
        self.url, self.timeout, self.wait, self.retries, self.log = url.rstrip("/"), timeout, wait, retries, log

    def exchange(self, method: str, path: str, body=None, *, what: str, timeout: float | None = None,
                 expect_json: bool = True, headers: dict | None = None):
        """One HTTP request and its answer (parsed JSON, or the raw bytes without `expect_json`)."""
        name = f"{method} {self.url}{path} ({what})"
        timeout = self.timeout if timeout is None else timeout
        req = urllib.request.Request(self.url + path, data=None if body is None else json.dumps(body).encode(),
                                     method=method, headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with _NO_PROXY.open(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise _timeout(name, timeout) from e
            why = "connection refused" if isinstance(e.reason, ConnectionRefusedError) else str(e.reason)
            raise RemoteEngineError(f"{name}: cannot reach the server ({why}). Is it running, on this address?",
                                    retryable=isinstance(e.reason, ConnectionRefusedError), reason=why) from e
        except (TimeoutError, socket.timeout) as e:
            raise _timeout(name, timeout) from e
        except (ConnectionError, OSError) as e:  # reset / dropped mid-answer
            raise RemoteEngineError(f"{name}: the connection failed mid-request ({e!r})", retryable=True,
                                    reason=f"connection failed ({e!r})") from e
        obj = None
        if expect_json or status >= 400:
            try:
                obj = json.loads(raw)
            except ValueError:
                if status < 400:
                    raise RemoteEngineError(f"{name}: HTTP {status} but the body is not JSON: {raw[:200]!r}") from None
        if status >= 400:
            msg = server_message(obj, raw)
            raise RemoteEngineError(f"{name}: HTTP {status}: {msg}", status, retryable=status == 503,
                                    reason=f"HTTP {status}: {msg}")
        return obj if expect_json else raw

    def call(self, method: str, path: str, body=None, *, what: str, attempt_body=None, on_timeout=None, **kw):
        """`exchange`, retried on what may pass. `attempt_body(attempt)` builds each attempt's body (a fresh request
        id per attempt); `on_timeout(body)` runs after an attempt timed out, before the next one."""
        for attempt in range(self.retries + 1):
            b = body if attempt_body is None else attempt_body(attempt)
            try:
                return self.exchange(method, path, b, what=what, **kw)
            except RemoteEngineError as e:
                if not e.retryable:
                    raise
                if e.timed_out and on_timeout is not None:
                    on_timeout(b)
                if attempt == self.retries:
                    raise RemoteEngineError(f"{e} (gave up after {attempt + 1} attempts)", e.status,
                                            reason=e.reason) from e
                delay = 2.0 ** attempt
                self.log(f"{e}; retrying in {delay:g} s (attempt {attempt + 2} of {self.retries + 1})")
                time.sleep(delay)

    def wait_ready(self, path: str = "/health", *, progress: bool = True) -> None:
        """Block until GET `path` answers 200: refused connections, 503 and time-outs are waited out for `wait`
        seconds; any other answer is raised at once."""
        t0, note = time.monotonic(), 0.0
        while True:
            try:
                self.exchange("GET", path, what="health check", timeout=min(self.timeout, 30.0), expect_json=False)
                if note and progress:
                    self.log(f"{self.url} is ready after {time.monotonic() - t0:.0f} s")
                return
            except RemoteEngineError as e:
                waited = time.monotonic() - t0
                if not e.retryable:
                    raise
                if waited >= self.wait:
                    raise RemoteEngineError(f"{e}; waited {self.wait:g} s for the server to start (--engine-wait)",
                                            e.status, reason=e.reason) from e
                if progress and waited >= note:
                    self.log(f"waiting for the server at {self.url}: {e.reason} ({waited:.0f} s of {self.wait:g} s; "
                             f"--engine-wait)")
                    note = waited + PROGRESS_EVERY
                time.sleep(min(1.0, max(0.0, self.wait - waited)))


def _timeout(name: str, timeout: float) -> RemoteEngineError:
    return RemoteEngineError(f"{name}: no answer within {timeout:g} s (timeout; --engine-timeout)", retryable=True,
                             timed_out=True, reason=f"no answer within {timeout:g} s")
