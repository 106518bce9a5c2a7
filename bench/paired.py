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
The consumer's batched ACKs are measured the same way on the real broker and weighed against B5's CPU per event
in the last full bench (a consumed message is a part of an event's cost, not all of it).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SLICE = 50  # accepts per slice: a pair of slices takes about a quarter of a second
THRESHOLD = 0.05  # issue 25: a device costing more than 5 % of a figure earns its place


@dataclass(frozen=True)
class Device:
    key: str
    name: str
    setting: str
    off: Any


DEVICES = (
    Device("remembered-routing", "remembered routing guards", "ACCEPT_REMEMBER_ROUTING", False),
    Device("plain-validator", "second validator", "SEND_PLAIN_VALIDATOR", False),
)


def backend_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def tree_cpu_ns(pids: list[int]) -> int:
    """CPU nanoseconds of every thread of these processes (RabbitMQ's Erlang VM runs dozens)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
    return total


def verdict(ratios: list[float], threshold: float = THRESHOLD) -> str:
    """Issue 25's rule on paired ratios (CPU off / CPU on, one per round): the device earns its place when
    its median cost is above the threshold and no round read it cheaper off, i.e. the sign is beyond noise
    (eight rounds all one way by chance: 1 in 256) and the size is the typical round's, not the luckiest."""
    if len(ratios) >= 4 and statistics.median(ratios) > 1 + threshold and min(ratios) > 1:
        return "earns its place"
    return "removable"


@contextmanager
def setting(name: str, value: Any) -> Iterator[None]:
    from django.conf import settings

    before = getattr(settings, name)
    setattr(settings, name, value)
    try:
        yield
    finally:
        setattr(settings, name, before)


def block(post: Callable[[], int], count: int, backend_pid: int) -> tuple[float, float]:
    """CPU ms per accept of this process and of its Postgres backend over `count` accepts."""
    cpu, pg = time.process_time(), backend_cpu_ns(backend_pid)
    for _ in range(count):
        status = post()
        if status != 202:
            raise RuntimeError(f"an accept answered {status}")
    return (time.process_time() - cpu) * 1000 / count, (backend_cpu_ns(backend_pid) - pg) / 1e6 / count


def measure(device: Device, post: Callable[[], int], backend_pid: int, rounds: int, count: int,
            log: Callable[[str], None], slice_size: int = SLICE) -> dict[str, Any]:
    on_ms, off_ms, ratios = [], [], []
    for r in range(rounds):
        # The round's accepts in slices of `slice_size`, on and off alternating (each pair in the other order
        # from the last): the host's speed drifts within seconds here, and a drift then weighs on both sides.
        totals = {True: [0.0, 0.0], False: [0.0, 0.0]}
        for i in range(max(1, count // slice_size)):
            for on in ([True, False] if (r + i) % 2 == 0 else [False, True]):
                with nullcontext() if on else setting(device.setting, device.off):
                    python_ms, postgres_ms = block(post, slice_size, backend_pid)
                totals[on][0] += python_ms
                totals[on][1] += postgres_ms
        slices = max(1, count // slice_size)
        got = {}
        for on, (python_ms, postgres_ms) in totals.items():
            got[on] = (python_ms + postgres_ms) / slices
            (on_ms if on else off_ms).append({"python": round(python_ms / slices, 4),
                                              "postgres": round(postgres_ms / slices, 4)})
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
    devices = [measure(d, post, backend_pid, rounds, count, log) for d in DEVICES]
    from .launcher import ROOT

    acks = measure_acks(rounds, 2 * count, log, b5_figure(ROOT / "artifacts" / "bench" / "results.json"))
    return {"rounds": rounds, "accepts_per_block": count, "devices": [*devices, acks]}


# ---------------------------------------------------------------------------------------------------------
# The consumer's batched ACKs: the product's DeferredAcks on a quorum queue of the real broker
# ---------------------------------------------------------------------------------------------------------

ACK_QUEUE = "pilot_status.bench.paired_acks"


def measure_acks(rounds: int, count: int, log: Callable[[str], None] = print,
                 figure: dict[str, Any] | None = None) -> dict[str, Any]:
    """CPU per consumed message (this process and RabbitMQ's) acked one by one (CONSUMER_ACK_BATCH=1) against
    the product's batch, `count` messages a side, alternating: what the batch saves where it saves it, the
    broker settling every ack through the quorum queue's Raft log. The figure the device serves is B5's: an
    event costs the whole machine `figure["ms"]` (the last full bench), of which one consumed message is part,
    so the verdict weighs what the batch saves against that, not against the consuming alone."""
    from django.conf import settings
    from kombu import Connection, Exchange, Queue

    from ingestion.acks import DeferredAcks
    from ingestion.consumer import ACK_MAX_DELAY_S, PREFETCH

    from .ablation_measure import own_server_roots
    from .procstats import tree

    (broker,) = own_server_roots()["rabbitmq"]
    batch = settings.CONSUMER_ACK_BATCH
    queue = Queue(ACK_QUEUE, Exchange(ACK_QUEUE, type="direct"), routing_key=ACK_QUEUE, durable=True,
                  queue_arguments={"x-queue-type": "quorum"})
    sides: dict[int, list[dict[str, float]]] = {1: [], batch: []}
    ratios = []
    with Connection(settings.EVOLUTION_RABBITMQ_URL or settings.CELERY_BROKER_URL) as connection:
        channel = connection.channel()
        bound = queue(channel)
        bound.declare()
        producer = connection.Producer(channel)
        try:
            for r in range(rounds):
                got = {}
                for size in ([1, batch] if r % 2 == 0 else [batch, 1]):
                    for i in range(count):
                        producer.publish({"n": i}, exchange=queue.exchange, routing_key=ACK_QUEUE)
                    acks = DeferredAcks(size, ACK_MAX_DELAY_S)
                    handled = 0

                    def on_message(body: Any, message: Any) -> None:
                        nonlocal handled
                        handled += 1
                        acks.add(message)

                    ours_before, broker_before = time.process_time(), tree_cpu_ns(tree(broker))
                    with connection.Consumer(bound, callbacks=[on_message], prefetch_count=PREFETCH):
                        while handled < count:
                            connection.drain_events(timeout=10)
                            acks.flush_if_due()
                        acks.flush()
                    # Every message was delivered (none ready) and the last acks had a moment to settle.
                    while bound.queue_declare(passive=True).message_count:
                        time.sleep(0.05)
                    time.sleep(0.2)
                    ours = (time.process_time() - ours_before) * 1000 / count
                    theirs = (tree_cpu_ns(tree(broker)) - broker_before) / 1e6 / count
                    got[size] = ours + theirs
                    sides[size].append({"consumer": round(ours, 4), "rabbitmq": round(theirs, 4)})
                ratios.append(got[1] / got[batch])
                log(f"  acks round {r + 1}: batch {batch} {got[batch]:.3f} ms, one by one {got[1]:.3f} ms "
                    f"({ratios[-1]:.3f}×)")
        finally:
            bound.delete()
    totals = {size: [sum(x.values()) for x in runs] for size, runs in sides.items()}
    costs = [off - on for off, on in zip(totals[1], totals[batch])]
    judged = [1 + cost / figure["ms"] for cost in costs] if figure else ratios
    return {"device": "batched consumer ACKs", "setting": "CONSUMER_ACK_BATCH=1", "unit": "consumed message",
            "on": sides[batch], "off": sides[1], "figure": figure,
            "ratios": [round(x, 4) for x in ratios], "median_ratio": round(statistics.median(ratios), 4),
            "figure_ratios": [round(x, 4) for x in judged], "verdict": verdict(judged)}


def b5_figure(path: Path) -> dict[str, Any] | None:
    """B5's machine CPU per event (both copies) in the results JSON of the last full bench, if there is one."""
    import json

    try:
        results = json.loads(path.read_text())
        ms = results["scenarios"]["B5"]["runs"][0]["cpu_ms_per_event"]["machine"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return {"name": "B5", "what": "machine CPU per event, both copies", "ms": ms,
            "commit": results.get("machine", {}).get("commit", "?")}


def _figure_cost(d: dict[str, Any]) -> str:
    judged = d.get("figure_ratios") or d["ratios"]
    share = f"{100 * (statistics.median(judged) - 1):+.1f} % ({100 * (min(judged) - 1):+.1f} to {100 * (max(judged) - 1):+.1f})"
    if figure := d.get("figure"):
        return (f"{share} of {figure['name']}'s {figure['ms']:.2f} ms of {figure['what']} "
                f"(full bench at `{figure['commit']}`)")
    if d.get("unit") == "accept":
        return f"{share} of B1's CPU per accept"
    return f"{share} of its own CPU (no full bench's figure to weigh it against)"


def render(result: dict[str, Any]) -> str:
    m = result.get("machine") or {}
    lines = [
        f"Commit `{m.get('commit', '?')}`{' (uncommitted changes)' if m.get('dirty') else ''}, {m.get('date', '?')}, "
        f"load before {m.get('load_before', '?')}. "
        f"Paired in one process (`python -m bench --paired`), {result['rounds']} rounds. The accept path's devices: "
        f"{result['accepts_per_block']:,} accepts a side a round, on and off alternating every 50, CPU of the process "
        "(Django's WSGI handler as gunicorn calls it: the whole middleware and view) and of its Postgres backend. "
        f"The consumer's ACKs: {2 * result['accepts_per_block']:,} messages a side a round from a quorum queue, acked "
        "by the product's DeferredAcks, CPU of the consuming process and of RabbitMQ. A device earns its place when "
        "off costs more than 5 % (the median round) and no round reads it cheaper off.",
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
