"""Circuit breakers in front of Evolution API: one per instance and one for the whole gateway.

closed → open: a run of `BREAKER_FAILURE_RUN` transient failures, or a failure rate of at least
`BREAKER_FAILURE_RATE` over `BREAKER_MIN_CALLS`+ calls in the current and previous window.
open: every send for that scope is held (put back with a due time, no attempt used) until
`BREAKER_OPEN_SECONDS` have passed. half-open: one caller wins the probe (SET NX); a success closes
the circuit, a failure opens it again for another period.

State lives in Redis so that every worker sees the same circuit. Redis is an accelerator, not a
dependency (docs/architecture.md, principle 3): when it cannot be reached the same logic runs on per-process state, so a
Redis outage never blocks sending.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings

from pilot_status import metrics
from pilot_status.redis_backoff import RedisBackoff

log = logging.getLogger(__name__)

GATEWAY = "gateway"
CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
OK, FAIL, NEUTRAL = "ok", "fail", "neutral"
_PREFIX = "ps:breaker:"


def instance_scope(name: str) -> str:
    return f"instance:{name}"


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    scope: str
    probe: bool = False
    retry_at: float | None = None  # epoch seconds; set when held


class Store(Protocol):
    def open_until(self, scope: str) -> float | None: ...
    def open_untils(self, scopes: list[str]) -> list[float | None]: ...
    def succeed_many(self, scopes: list[str], now: float) -> None: ...
    def set_open(self, scope: str, until: float) -> None: ...
    def close(self, scope: str) -> None: ...
    def fail(self, scope: str, now: float) -> tuple[int, int, int]: ...  # run, ok, failed in window
    def succeed(self, scope: str, now: float) -> None: ...
    def try_probe(self, scope: str, ttl: float) -> bool: ...
    def release_probe(self, scope: str) -> None: ...


def _window(now: float) -> int:
    return int(now // settings.BREAKER_WINDOW_SECONDS)


class RedisStore:
    def __init__(self, client: Any):
        self.r = client

    def _key(self, scope: str, part: str) -> str:
        return f"{_PREFIX}{scope}:{part}"

    def open_until(self, scope: str) -> float | None:
        value = self.r.get(self._key(scope, "open_until"))
        return float(value) if value is not None else None

    def open_untils(self, scopes: list[str]) -> list[float | None]:
        values = self.r.mget([self._key(scope, "open_until") for scope in scopes])
        return [float(value) if value is not None else None for value in values]

    def set_open(self, scope: str, until: float) -> None:
        pipe = self.r.pipeline()
        pipe.set(self._key(scope, "open_until"), repr(until))
        pipe.delete(self._key(scope, "probe"))
        pipe.execute()

    def close(self, scope: str) -> None:
        self.r.delete(*(self._key(scope, p) for p in ("open_until", "probe", "run")))

    def fail(self, scope: str, now: float) -> tuple[int, int, int]:
        current, previous = self._key(scope, f"w:{_window(now)}"), self._key(scope, f"w:{_window(now) - 1}")
        pipe = self.r.pipeline()
        pipe.incr(self._key(scope, "run"))
        pipe.expire(self._key(scope, "run"), settings.BREAKER_WINDOW_SECONDS * 10)
        pipe.hincrby(current, "fail", 1)
        pipe.expire(current, settings.BREAKER_WINDOW_SECONDS * 2)
        pipe.hmget(current, "ok", "fail")
        pipe.hmget(previous, "ok", "fail")
        run, _, _, _, now_counts, before = pipe.execute()
        ok = sum(int(v or 0) for v in (now_counts[0], before[0]))
        failed = sum(int(v or 0) for v in (now_counts[1], before[1]))
        return int(run), ok, failed

    def succeed(self, scope: str, now: float) -> None:
        self.succeed_many([scope], now)

    def succeed_many(self, scopes: list[str], now: float) -> None:
        pipe = self.r.pipeline(transaction=False)
        for scope in scopes:
            current = self._key(scope, f"w:{_window(now)}")
            pipe.delete(self._key(scope, "run"))
            pipe.hincrby(current, "ok", 1)
            pipe.expire(current, settings.BREAKER_WINDOW_SECONDS * 2)
        pipe.execute()

    def try_probe(self, scope: str, ttl: float) -> bool:
        return bool(self.r.set(self._key(scope, "probe"), "1", nx=True, px=int(ttl * 1000)))

    def release_probe(self, scope: str) -> None:
        self.r.delete(self._key(scope, "probe"))


@dataclass
class _Local:
    open_until: float | None = None
    run: int = 0
    windows: dict[int, list[int]] = field(default_factory=dict)  # window → [ok, failed]
    probe_until: float = 0.0


class MemoryStore:
    """The same circuit on per-process state, used while Redis cannot be reached."""

    def __init__(self) -> None:
        self.scopes: dict[str, _Local] = {}
        self.lock = threading.Lock()

    def _get(self, scope: str) -> _Local:
        return self.scopes.setdefault(scope, _Local())

    def open_until(self, scope: str) -> float | None:
        return self._get(scope).open_until

    def open_untils(self, scopes: list[str]) -> list[float | None]:
        return [self.open_until(scope) for scope in scopes]

    def succeed_many(self, scopes: list[str], now: float) -> None:
        for scope in scopes:
            self.succeed(scope, now)

    def set_open(self, scope: str, until: float) -> None:
        with self.lock:
            state = self._get(scope)
            state.open_until, state.probe_until = until, 0.0

    def close(self, scope: str) -> None:
        with self.lock:
            state = self._get(scope)
            state.open_until, state.run, state.probe_until = None, 0, 0.0

    def fail(self, scope: str, now: float) -> tuple[int, int, int]:
        with self.lock:
            state = self._get(scope)
            state.run += 1
            window = _window(now)
            state.windows = {w: c for w, c in state.windows.items() if w >= window - 1}
            state.windows.setdefault(window, [0, 0])[1] += 1
            ok = sum(c[0] for c in state.windows.values())
            failed = sum(c[1] for c in state.windows.values())
            return state.run, ok, failed

    def succeed(self, scope: str, now: float) -> None:
        with self.lock:
            state = self._get(scope)
            state.run = 0
            state.windows.setdefault(_window(now), [0, 0])[0] += 1

    def try_probe(self, scope: str, ttl: float) -> bool:
        with self.lock:
            state = self._get(scope)
            now = time.time()
            if state.probe_until > now:
                return False
            state.probe_until = now + ttl
            return True

    def release_probe(self, scope: str) -> None:
        with self.lock:
            self._get(scope).probe_until = 0.0


local_store = MemoryStore()


# After Redis fails, skip it for a few seconds: each try costs a connect timeout on the send path.
_redis = RedisBackoff("circuit breaker on per-process state")


def _call(method: str, *args: Any) -> Any:
    """Run a store operation on Redis, or on this process's memory when Redis is unreachable."""
    if _redis.ready():
        try:
            return getattr(RedisStore(metrics.redis()), method)(*args)
        except Exception as exc:  # Redis down or slow: never block sending on it
            _redis.failed(exc)
    return getattr(local_store, method)(*args)


def _probe_ttl() -> float:
    # A probe that never reports back (worker died) must not keep the circuit half-open forever.
    return settings.EVOLUTION_CONNECT_TIMEOUT + settings.EVOLUTION_READ_TIMEOUT + 5


# `check(until=LOOK_UP)`: read the circuit from the store (the caller did not prefetch it).
LOOK_UP: Any = object()


def open_untils(scopes: list[str]) -> dict[str, float | None]:
    """Every scope's `open_until` in one round trip (None: closed), for `check(until=…)`."""
    return dict(zip(scopes, _call("open_untils", scopes)))


def check(scope: str, now: float | None = None, until: float | None = LOOK_UP) -> Verdict:
    """May a call go through this circuit now? Half-open lets exactly one probe through.

    `until` is the scope's `open_until` when the caller already read it (`open_untils`)."""
    now = now or time.time()
    if until is LOOK_UP:
        until = _call("open_until", scope)
    if until is None:
        return Verdict(True, scope)
    if now < until:
        return Verdict(False, scope, retry_at=until)
    if _call("try_probe", scope, _probe_ttl()):
        log.info("circuit %s half-open: sending a probe", scope)
        return Verdict(True, scope, probe=True)
    # Someone else is probing: look again shortly.
    return Verdict(False, scope, retry_at=now + min(5.0, settings.BREAKER_OPEN_SECONDS))


def is_open(scope: str) -> bool:
    """True while the circuit is open or half-open (a fallback must not pick it)."""
    return _call("open_until", scope) is not None


def state_of(scope: str, now: float | None = None) -> str:
    until = _call("open_until", scope)
    if until is None:
        return CLOSED
    return OPEN if (now or time.time()) < until else HALF_OPEN


def record_successes(scopes: list[str], now: float | None = None) -> None:
    """The common case in one round trip: calls that succeeded through circuits that were closed
    when checked. (One that opened meanwhile stays open until its own probe closes it.)"""
    _call("succeed_many", scopes, now or time.time())


def record(scope: str, result: str, now: float | None = None) -> str | None:
    """Feed one call's result; returns "opened" or "closed" when the circuit changed."""
    now = now or time.time()
    if result == NEUTRAL:
        _call("release_probe", scope)
        return None
    if result == OK:
        was_open = _call("open_until", scope) is not None
        _call("succeed", scope, now)
        if was_open:
            _call("close", scope)
            log.warning("circuit %s closed: the probe succeeded", scope)
            metrics.evolution(f"breaker:{_kind(scope)}:closed")
            return "closed"
        return None
    run, ok, failed = _call("fail", scope, now)
    if _call("open_until", scope) is not None:
        # The probe (or a call that raced it) failed: hold for another period.
        _call("set_open", scope, now + settings.BREAKER_OPEN_SECONDS)
        return "opened"
    threshold = settings.BREAKER_GATEWAY_FAILURE_RUN if scope == GATEWAY else settings.BREAKER_FAILURE_RUN
    calls = ok + failed
    by_rate = calls >= settings.BREAKER_MIN_CALLS and failed / calls >= settings.BREAKER_FAILURE_RATE
    if run >= threshold or by_rate:
        _call("set_open", scope, now + settings.BREAKER_OPEN_SECONDS)
        log.error(
            "circuit %s opened: %d failures in a row, %d/%d failed in the window; holding sends for %.0fs",
            scope, run, failed, calls, settings.BREAKER_OPEN_SECONDS,
        )
        metrics.evolution(f"breaker:{_kind(scope)}:opened")
        return "opened"
    return None


def reset_local() -> None:
    """Forget this process's fallback state and try Redis again at once."""
    global local_store
    _redis.reset()
    local_store = MemoryStore()


def reset(scope: str) -> None:
    """Close a circuit by hand (operators, tests)."""
    _call("close", scope)


def _kind(scope: str) -> str:
    return GATEWAY if scope == GATEWAY else "instance"
