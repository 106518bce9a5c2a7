"""What every scenario shares: the running stack, the simulator, the actors, sizes and helpers."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .launcher import LANES, BenchStack
from .procstats import CpuMeter, server_roots
from .sizes import Sizes
from .world import Simulator, World, empty_tables, register_all

# Queues a scenario may leave work in, on the Celery broker: the lanes and the callbacks (B3).
PURGED_QUEUES = (*LANES, "maintenance", "sync", "bulk", "callbacks", "callbacks_relay")


@dataclass
class Context:
    stack: BenchStack
    sim: Simulator
    world: World
    sizes: Sizes
    results: dict[str, Any] = field(default_factory=dict)
    log: Callable[[str], None] = print

    def roots(self) -> dict[str, list[int]]:
        """Root pids per process kind, for CPU and RSS (read again after a restart)."""
        roots: dict[str, list[int]] = {}
        for process in self.stack.processes.values():
            if process.alive():
                roots.setdefault(process.kind, []).append(process.pid)
        return roots

    def cpu(self, servers: bool = False) -> CpuMeter:
        """CPU per process kind; with `servers`, Postgres, RabbitMQ and Redis too."""
        roots = self.roots()
        if servers:
            roots.update(server_roots())
        return CpuMeter(roots)

    def fresh(self, ack_delays_ms: dict[str, float | None] | None = None) -> None:
        """Empty tables and queues, reset the simulator: every run starts from the same state."""
        # First: the simulator's pending webhook retries of the previous run must not land in this one.
        self.sim.reset()
        stop_releases()
        purge_queues()
        drain_sends()
        self.sim.reset()  # the receipts of the sends that ended during the drain
        wait_for_quiet_database()
        empty_tables()
        purge_queues()
        register_all(self.sim, self.world, self.stack.webhook_url, ack_delays_ms=ack_delays_ms)
        from messaging.models import Instance

        Instance.objects.update(connection_state="open")


def stop_releases() -> None:
    """Delete the outbox, so that the relay hands out nothing more of a backlog a run left (B8 leaves most
    of its 5,000): with hundreds of lane threads still sending it, there was nearly always a transaction
    on the tables, and the TRUNCATE after it ran out of tries under load. Row locks only: it waits for a
    relay pass in progress, then the sends already handed out end within their latency."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM messaging_outboxentry")


# How long the sends already handed out may take to end: B8's slowest gateway answers in 3 s, and a lane
# worker's threads may hold a few hundred of them.
DRAIN_TIMEOUT_S = 90.0


def drain_sends(timeout: float = DRAIN_TIMEOUT_S) -> None:
    """Wait until no message is SENDING: each such send holds row locks until its answer is written, and the
    TRUNCATE after it would otherwise run out of tries behind hundreds of them (B8 at 3 s latency). With the
    outbox empty and the queues purged, nothing claims anew, so the count only falls."""
    from messaging.models import Message

    met, _ = wait_for(lambda: not Message.objects.filter(status="SENDING").exists(), timeout)
    if not met:
        DISTURBANCES.append(f"{time.strftime('%H:%M:%S')} sends still SENDING after {timeout:.0f} s")


def purge_queues() -> None:
    """The Celery queues, then our side of Evolution's RabbitMQ channel, which lives on its own vhost
    (EVOLUTION_RABBITMQ_URL): a busy run leaves thousands of receipts there that the next run's consumer
    would otherwise work through first."""
    from django.conf import settings
    from kombu import Connection

    from bench.celery_app import app
    from ingestion.consumer import topology

    with app.connection_for_write() as conn:
        purge(conn, PURGED_QUEUES)
    if settings.EVOLUTION_RABBITMQ_URL:
        ours = topology()
        with Connection(settings.EVOLUTION_RABBITMQ_URL) as conn:
            purge(conn, tuple(str(q.name) for q in (ours.work, *ours.retries)))


def purge(conn: Any, queues: tuple[str, ...]) -> None:
    for queue in queues:
        try:
            conn.default_channel.queue_purge(queue)
        except Exception:
            # Not declared yet (or declared with other arguments): nothing to purge; reopen the channel.
            conn.close()
            conn.connect()


# Database errors seen while polling (Postgres restarted by someone else's test on a shared machine).
# The figures of a scenario that saw any are marked as disturbed in the report.
DISTURBANCES: list[str] = []


QUIET_TIMEOUT_S = 60.0


def wait_for_quiet_database(timeout: float = QUIET_TIMEOUT_S) -> None:
    """Wait for a moment when no other session of the bench database is inside a transaction. After a backlog the
    webhook pool still works through the receipts of the last sends, and a webhook thread (background priority, on a
    busy machine) can sit idle in transaction for longer than the TRUNCATE's lock timeout, every try: the TRUNCATE
    then ran out of tries (bench/findings.md, "Reading the numbers")."""
    from django.db import connection

    def quiet() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                           " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL")
            return bool(cursor.fetchone()[0] == 0)

    met, _ = wait_for(quiet, timeout, interval=0.1)
    if not met:
        DISTURBANCES.append(f"{time.strftime('%H:%M:%S')} the database not quiet after {timeout:.0f} s")


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.25) -> tuple[bool, Any]:
    """Poll until predicate() is truthy; (met, last value). Never raises on timeout: the bench reports it."""
    from django.db import DatabaseError, connections

    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = predicate()
        except DatabaseError as exc:
            # Keep measuring through a database restart: the product must recover, and the
            # report says the run was disturbed.
            DISTURBANCES.append(f"{time.strftime('%H:%M:%S')} {exc.__class__.__name__}: {str(exc).strip()[:80]}")
            connections.close_all()
            last = None
        if last:
            return True, last
        if time.monotonic() >= deadline:
            return False, last
        time.sleep(interval)


def cpu_summary(meter: CpuMeter) -> dict[str, Any]:
    """CPU seconds per kind and as a share of the machine's capacity (cores x wall time)."""
    import os

    capacity = (os.cpu_count() or 1) * meter.wall
    return {
        "wall_s": round(meter.wall, 2),
        "machine_busy_share": round(meter.machine_busy / capacity, 3) if capacity else None,
        "cpu_s": {kind: round(value, 2) for kind, value in sorted(meter.by_kind.items())},
        "share": {kind: round(value / capacity, 3) for kind, value in sorted(meter.by_kind.items())} if capacity else {},
    }


def per_unit(meter: CpuMeter, count: int) -> dict[str, float]:
    """CPU milliseconds per unit of work (request, message, task) for each kind, and the machine's."""
    if count <= 0:
        return {}
    per = {kind: round(1000 * seconds / count, 2) for kind, seconds in sorted(meter.by_kind.items())}
    per["machine"] = round(1000 * meter.machine_busy / count, 2)
    return per
