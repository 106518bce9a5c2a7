"""HTTP load for B1: wrk (Debian's `wrk` package) when installed, else a small threaded client.

Both keep connections alive, hold a fixed number of connections busy for a fixed time, and report
requests, non-2xx answers and latency percentiles in the same shape.
"""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

from .stats import percentile


@dataclass
class LoadResult:
    tool: str
    requests: int
    errors: int  # non-2xx answers plus socket errors and timeouts
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rate(self) -> float:
        return (self.requests - self.errors) / self.seconds if self.seconds else 0.0


_LUA = """
wrk.method = "POST"
wrk.body = %(body)s
wrk.headers["Content-Type"] = "application/json"
%(auth)s
local counter = 0
local threads = {}
function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end
%(request)s
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCHJSON {"requests":%%d,"duration_us":%%d,"errors":%%d,"p50_us":%%d,"p99_us":%%d,"max_us":%%d}\\n',
    summary.requests, summary.duration, e.status + e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""

_IDEMPOTENT_REQUEST = """
request = function()
  counter = counter + 1
  wrk.headers["Idempotency-Key"] = "%(run)s-" .. tid .. "-" .. counter
  return wrk.format()
end
"""


def _lua_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid Lua string literal for ASCII text


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(url: str, body: dict[str, object], connections: int, seconds: float, token: str | None = None,
            idempotency: bool = False, threads: int = 2) -> LoadResult:
    script = _LUA % {
        "body": _lua_string(json.dumps(body)),
        "auth": f'wrk.headers["Authorization"] = {_lua_string("Bearer " + token)}' if token else "",
        "request": _IDEMPOTENT_REQUEST % {"run": uuid.uuid4().hex[:12]} if idempotency else "",
    }
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    out = subprocess.run(
        ["wrk", "-t", str(min(threads, connections)), "-c", str(connections), "-d", f"{max(1, int(seconds))}s",
         "--timeout", "10s", "-s", handle.name, url],
        capture_output=True, text=True, timeout=seconds + 60, check=True,
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("BENCHJSON "))
    data = json.loads(line.split(" ", 1)[1])
    return LoadResult(
        "wrk", data["requests"], data["errors"], data["duration_us"] / 1e6,
        data["p50_us"] / 1000, data["p99_us"] / 1000, data["max_us"] / 1000,
    )


def run_threads(url: str, body: dict[str, object], connections: int, seconds: float, token: str | None = None,
                idempotency: bool = False) -> LoadResult:
    """The fallback: one keep-alive connection per thread. Heavier than wrk on the CPU it shares."""
    parsed = urlparse(url)
    payload = json.dumps(body).encode()
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    run = uuid.uuid4().hex[:12]

    def client(n: int) -> None:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
        mine: list[float] = []
        bad = 0
        i = 0
        while time.monotonic() < deadline:
            headers = {"Content-Type": "application/json"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            if idempotency:
                i += 1
                headers["Idempotency-Key"] = f"{run}-{n}-{i}"
            start = time.perf_counter()
            try:
                conn.request("POST", parsed.path, payload, headers)
                response = conn.getresponse()
                response.read()
                if not 200 <= response.status < 300:
                    bad += 1
            except (OSError, http.client.HTTPException):
                bad += 1
                conn.close()
                conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
            mine.append((time.perf_counter() - start) * 1000)
        conn.close()
        with lock:
            latencies.extend(mine)
            errors[0] += bad

    started = time.monotonic()
    workers = [threading.Thread(target=client, args=(n,)) for n in range(connections)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    return LoadResult(
        "python-threads", len(latencies), errors[0], elapsed,
        percentile(latencies, 50), percentile(latencies, 99), max(latencies, default=0.0),
    )


def post_load(url: str, body: dict[str, object], connections: int, seconds: float, token: str | None = None,
              idempotency: bool = False, tool: str = "auto") -> LoadResult:
    if tool == "wrk" or (tool == "auto" and have_wrk()):
        return run_wrk(url, body, connections, seconds, token, idempotency)
    return run_threads(url, body, connections, seconds, token, idempotency)
