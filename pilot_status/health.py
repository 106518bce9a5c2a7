"""Liveness and readiness probes for load balancers, compose and Kubernetes (issue 24).

- `/healthz`: this process answers. No dependency is looked at, so a Postgres outage never makes an
  orchestrator restart every web worker (the API answers 503 `unavailable` by itself meanwhile).
- `/readyz`: Postgres, Redis and the broker are reachable, each with its latency in ms; 503 with the
  JSON error envelope (`not_ready`, naming the failed checks) when one is not. The checks run at once,
  each on a fresh connection, and the answer comes within `READINESS_TIMEOUT_SECONDS` whatever hangs.
  The probe needs no credential, so a process answers from its last check for `READINESS_CACHE_SECONDS`
  (1 s): a flood of probes costs each process one check a second, never a connection per request. One
  request checks at a time; those that arrive meanwhile wait for its answer instead of checking too.

On the web pool `ProbeMiddleware` answers both first in the chain: no HTTPS redirect (a probe speaks
plain HTTP to the pod), no host check (a probe names the pod's address, which ALLOWED_HOSTS need not
list: host checking stays as strict for every other path), no session. The webhook pool routes them
like its other endpoints (pilot_status/internal_urls.py).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from .errors import error_body

log = logging.getLogger(__name__)


def run_within(checks: dict[str, Callable[[], Any]], timeout: float) -> dict[str, dict[str, Any]]:
    """Run each check in its own thread, all at once; `{name: {"ok", "ms", "value" | "error"}}` by `timeout`.

    A check still running at the deadline is reported as failed; its thread ends on its own
    (every check here has its own connect/socket timeouts) and is never waited for."""
    results: dict[str, dict[str, Any]] = {}
    done = {name: threading.Event() for name in checks}

    def one(name: str, check: Callable[[], Any]) -> None:
        started = time.perf_counter()
        try:
            value = check()
            outcome: dict[str, Any] = {"ok": True, "value": value}
        except Exception as exc:
            outcome = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"[:300]}
        outcome["ms"] = round((time.perf_counter() - started) * 1000, 1)
        results[name] = outcome
        done[name].set()

    for name, check in checks.items():
        threading.Thread(target=one, args=(name, check), name=f"check {name}", daemon=True).start()
    deadline = time.monotonic() + timeout
    for name in checks:
        if not done[name].wait(max(0.0, deadline - time.monotonic())):
            results[name] = {"ok": False, "ms": round(timeout * 1000, 1), "error": f"no answer within {timeout:g} s"}
    return {name: results[name] for name in checks}


_checking = threading.Lock()
_last: tuple[float, dict[str, dict[str, Any]]] | None = None  # (monotonic time it was made, the results)


def forget() -> None:
    """Drop this process's last check: the next probe checks again."""
    global _last
    _last = None


def _fresh(last: tuple[float, dict[str, dict[str, Any]]] | None) -> dict[str, dict[str, Any]] | None:
    if last is not None and time.monotonic() - last[0] < settings.READINESS_CACHE_SECONDS:
        return last[1]
    return None


def cached_results() -> dict[str, dict[str, Any]]:
    """The checks' results, made at most READINESS_CACHE_SECONDS ago (0: made for this call)."""
    global _last
    found = _fresh(_last)
    if found is not None:
        return found
    with _checking:
        found = _fresh(_last)  # made by the request this one waited for
        if found is not None:
            return found
        results = run_within(CHECKS, settings.READINESS_TIMEOUT_SECONDS)
        _last = (time.monotonic(), results)
        return results


def check_postgres() -> None:
    import psycopg

    timeout = settings.READINESS_TIMEOUT_SECONDS
    with psycopg.connect(
        settings.DATABASE_URL, connect_timeout=max(1, math.ceil(timeout)),
        options=f"-c statement_timeout={int(timeout * 1000)}", autocommit=True,
    ) as connection:
        connection.execute("SELECT 1")


def check_redis() -> None:
    from .metrics import redis

    redis().ping()  # settings: 0.5 s connect and socket timeouts


def check_broker() -> None:
    from kombu import Connection

    with Connection(settings.CELERY_BROKER_URL, connect_timeout=settings.READINESS_TIMEOUT_SECONDS) as connection:
        connection.ensure_connection(max_retries=0)


CHECKS: dict[str, Callable[[], Any]] = {"postgres": check_postgres, "redis": check_redis, "broker": check_broker}


def _method_not_allowed() -> HttpResponse:
    response = JsonResponse(error_body("method_not_allowed", "This method is not allowed here."), status=405)
    response["Allow"] = "GET, HEAD"
    return response


def _no_store(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"
    return response


def healthz(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed()
    return _no_store(JsonResponse({"status": "ok"}))


def readyz(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed()
    results = cached_results()
    checks: dict[str, dict[str, Any]] = {}
    for name, result in results.items():
        checks[name] = {"ok": result["ok"], "ms": result["ms"]}
        if not result["ok"]:
            # The probe may be reachable from outside: name the kind of failure, log the rest (the
            # full text holds internal addresses).
            log.warning("readyz: %s not ready: %s", name, result["error"])
            checks[name]["error"] = result["error"].split(":")[0]
    failed = [name for name, result in checks.items() if not result["ok"]]
    if not failed:
        return _no_store(JsonResponse({"status": "ready", "checks": checks}))
    body = error_body("not_ready", f"Not ready: {', '.join(failed)} unreachable.", {"failed": failed, "checks": checks})
    response = JsonResponse({**body, "status": "not_ready", "checks": checks}, status=503)
    response["Retry-After"] = "5"
    return _no_store(response)


PROBES: dict[str, Callable[[HttpRequest], HttpResponse]] = {"/healthz": healthz, "/readyz": readyz}


class ProbeMiddleware:
    """First in the web pool's chain: the probes, before the redirect, the host check and the session."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = PROBES.get(request.path_info)
        if probe is None:
            return self.get_response(request)
        return probe(request)
