"""`python -m bench --paired`: what an accept-path device saves, measured in one process, on and off alternating.

The stack-level ablation (bench/ablation.py) cannot resolve a change under about 15 % on this host: B1's CPU
ratio read 1.27-1.99 for variants that cannot touch the accept. A device of the accept path is measured here
instead, where the host's noise mostly cancels: one process sends accepts through Django's WSGI handler (the
whole middleware, view and accept, as gunicorn calls it), in slices that alternate the device on and off, and counts the CPU
each block took in this process and in its Postgres backend (/proc/<pid>/schedstat, nanoseconds: Postgres
runs as a process of this machine). Wall time is not used: other processes' load moves it, CPU time far less.

A block's CPU per accept off over on is one paired ratio; the device's cost is their median over the rounds,
judged by issue 25's rule: it earns its place when switching it off costs more than 5 % of the accept's CPU
(the median round) and no round reads it cheaper off. The accept's CPU is what bounds B1 on a CPU-bound machine.
The consumer's batched ACKs were measured this way too (at 0346852, consuming from a quiet quorum queue, weighed
against B5's CPU per event) and read 2.6 %; B5 in the stack read 9 % (bench/findings.md), the broker's per-ack
work costing more while Evolution publishes. So only devices whose whole cost is in one process are measured here.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

SLICE = 50  # accepts per slice: a pair of slices takes about a quarter of a second
THRESHOLD = 0.05  # issue 25: a device costing more than 5 % of a figure earns its place


@dataclass(frozen=True)
class Device:
    key: str
    name: str
    setting: str  # a Django setting, switched off by override_settings(setting=off)
    off: Any

    def switched_off(self) -> Any:
        from django.test import override_settings

        return override_settings(**{self.setting: self.off})


@dataclass(frozen=True)
class LibraryLimit(Device):
    """A module constant of a library, set to `off` for the off slices (`setting` is module.NAME)."""

    def switched_off(self) -> Any:
        import importlib
        from unittest import mock

        module, _, name = self.setting.rpartition(".")
        return mock.patch.object(importlib.import_module(module), name, self.off)


class Forgetful(dict[Any, Any]):
    """A cache that keeps nothing: every lookup misses, as before the cache existed."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __int__(self) -> int:  # the off side's name in the table: `module.cache=0`
        return 0


# The accept-path devices behind a switch, measured on and off. The remembered routing and the second validator,
# measured here before, are the product's only paths now (bench/findings.md, "One path per job"). The metrics
# carry's other half is the Redis server's work, so Redis's CPU is counted beside Postgres's. psycopg keeps a
# statement's parsed form only up to 50 parameters; the accept's statement leaves the columns the database fills
# by itself out to stay within it (messaging.inserts): off, every statement is parsed again, as one over 50 was.
# A row's INSERT text is kept per shape (messaging.inserts): off, the cache forgets and Django's compiler writes
# every row's INSERT again, as it did before.
DEVICES: tuple[Device, ...] = (
    Device("metrics-carry", "metrics carry", "METRICS_FLUSH_SECONDS", 0),
    LibraryLimit("parse-cache", "psycopg's cache of parsed statements", "psycopg._queries.MAX_CACHED_STATEMENT_PARAMS", -1),
    LibraryLimit("insert-text", "the accept's insert text once per shape", "messaging.inserts._statements", Forgetful()),
)


def backend_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def verdict(ratios: list[float], threshold: float = THRESHOLD) -> str:
    """Issue 25's rule on paired ratios (CPU off / CPU on, one per round): the device earns its place when
    its median cost is above the threshold and no round read it cheaper off, i.e. the sign is beyond noise
    (eight rounds all one way by chance: 1 in 256) and the size is the typical round's, not the luckiest."""
    if len(ratios) >= 4 and statistics.median(ratios) > 1 + threshold and min(ratios) > 1:
        return "earns its place"
    return "removable"


def block(post: Callable[[], int], count: int, backend_pid: int, redis_pid: int) -> tuple[float, float, float]:
    """CPU ms per accept of this process, of its Postgres backend and of the Redis server over `count` accepts."""
    cpu, pg, rd = time.process_time(), backend_cpu_ns(backend_pid), backend_cpu_ns(redis_pid)
    for _ in range(count):
        post()  # raises on anything but a 202
    return ((time.process_time() - cpu) * 1000 / count, (backend_cpu_ns(backend_pid) - pg) / 1e6 / count,
            (backend_cpu_ns(redis_pid) - rd) / 1e6 / count)


def measure(device: Device, post: Callable[[], int], backend_pid: int, redis_pid: int, rounds: int, count: int,
            log: Callable[[str], None], slice_size: int = SLICE) -> dict[str, Any]:
    on_ms, off_ms, ratios = [], [], []
    for r in range(rounds):
        # The round's accepts in slices of `slice_size`, on and off alternating (each pair in the other order
        # from the last): the host's speed drifts within seconds here, and a drift then weighs on both sides.
        totals = {True: [0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0]}
        for i in range(max(1, count // slice_size)):
            for on in ([True, False] if (r + i) % 2 == 0 else [False, True]):
                with nullcontext() if on else device.switched_off():
                    python_ms, postgres_ms, redis_ms = block(post, slice_size, backend_pid, redis_pid)
                totals[on][0] += python_ms
                totals[on][1] += postgres_ms
                totals[on][2] += redis_ms
        slices = max(1, count // slice_size)
        got = {}
        for on, (python_ms, postgres_ms, redis_ms) in totals.items():
            got[on] = (python_ms + postgres_ms + redis_ms) / slices
            (on_ms if on else off_ms).append({"python": round(python_ms / slices, 4),
                                              "postgres": round(postgres_ms / slices, 4),
                                              "redis": round(redis_ms / slices, 4)})
        ratios.append(got[False] / got[True])
        log(f"  {device.key} round {r + 1}: on {got[True]:.3f} ms, off {got[False]:.3f} ms ({ratios[-1]:.3f}×)")
    return {"device": device.name, "setting": f"{device.setting}={int(device.off)}", "unit": "accept",
            "on": on_ms, "off": off_ms,
            "ratios": [round(x, 4) for x in ratios], "median_ratio": round(statistics.median(ratios), 4),
            "verdict": verdict(ratios)}


def run(world: Any, rounds: int, count: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    import io
    import json

    from django.core.handlers.wsgi import WSGIHandler
    from django.db import connection

    from .scenarios.b1_accept import SEND_PATH, send_body

    # The WSGI handler called as gunicorn calls it (Django's test client adds its own work per request).
    handler = WSGIHandler()
    payload = json.dumps(send_body(world.a.recipients[0])).encode()
    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        statuses.append(status)

    def post() -> int:
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": SEND_PATH, "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000", "HTTP_HOST": "127.0.0.1", "REMOTE_ADDR": "127.0.0.1", "SERVER_PROTOCOL": "HTTP/1.1",
            "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(payload)),
            "HTTP_AUTHORIZATION": f"Bearer {world.a.live_key}", "HTTP_IDEMPOTENCY_KEY": str(uuid.uuid4()),
            "wsgi.input": io.BytesIO(payload), "wsgi.url_scheme": "http", "wsgi.errors": io.StringIO(),
            "wsgi.multithread": False, "wsgi.multiprocess": True, "wsgi.run_once": False, "wsgi.version": (1, 0),
        }
        body = b"".join(handler(environ, start_response))
        status = int(statuses.pop().split()[0])
        if status != 202:
            raise RuntimeError(f"an accept answered {status}: {body[:300]!r}")
        return status

    # One backend for the whole run, its CPU counted across blocks (a connection past CONN_MAX_AGE would be
    # closed between requests, and its backend's count with it).
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = None
    for _ in range(200):  # caches, prepared statements, the remembered routing
        post()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend_pid = cursor.fetchone()[0]
    from pilot_status.metrics import redis

    redis_pid = int(redis().info("server")["process_id"])
    devices = [measure(d, post, backend_pid, redis_pid, rounds, count, log) for d in DEVICES]
    return {"rounds": rounds, "accepts_per_block": count, "devices": devices}


def _figure_cost(d: dict[str, Any]) -> str:
    share = (f"{100 * (d['median_ratio'] - 1):+.1f} % ({100 * (min(d['ratios']) - 1):+.1f} to "
             f"{100 * (max(d['ratios']) - 1):+.1f})")
    return f"{share} of B1's CPU per accept"


def render(result: dict[str, Any]) -> str:
    m = result.get("machine") or {}
    lines = [
        f"Commit `{m.get('commit', '?')}`{' (uncommitted changes)' if m.get('dirty') else ''}, {m.get('date', '?')}, "
        f"load before {m.get('load_before', '?')}. "
        f"Paired in one process (`python -m bench --paired`), {result['rounds']} rounds. The accept path's devices: "
        f"{result['accepts_per_block']:,} accepts a side a round, on and off alternating every 50, CPU of the process "
        "(Django's WSGI handler as gunicorn calls it: the whole middleware and view), of its Postgres backend "
        "and, where the run recorded it, of the Redis server. "
        "A device earns its place when off costs more than 5 % (the median round) and no round reads it cheaper "
        "off. The stack-level ablation cannot resolve changes this small on this host, so for these devices this "
        "table decides; the consumer's batched ACKs were decided by B5 in the stack (bench/findings.md).",
        "",
        "| device off | switch | CPU on → off (median) | off / on, median (min–max) | what off costs the figure it serves, median (min–max) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for d in result["devices"]:
        on = statistics.median(sum(x.values()) for x in d["on"])
        off = statistics.median(sum(x.values()) for x in d["off"])
        unit = d.get("unit", "accept")
        lines.append(f"| {d['device']} | `{d['setting']}` | {on:.3f} → {off:.3f} ms per {unit} | {d['median_ratio']:.3f}× "
                     f"({min(d['ratios']):.3f}–{max(d['ratios']):.3f}) | {_figure_cost(d)} | **{d['verdict']}** |")
    return "\n".join(lines) + "\n"
