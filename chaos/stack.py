"""Start the simulator, the TCP proxy in front of it, and the product's stack for a chaos run.

The stack is tests/support/processes.Stack (gunicorn, relay, consumer, one Celery worker per lane,
each in its own process group so a SIGKILL takes exactly it), pointed at the proxy instead of the
simulator. The harness talks to the simulator's control API directly. Every command comes from the
process topology (pilot_status/topology.py); this module adds only its ports, logs and environment.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from .proxy import TcpProxy

# Knobs the chaos stack runs with (the product's own settings, through the environment):
CHAOS_ENV = {
    # Faults, not throughput, are under test: no 429s from our own load generator.
    "RATE_LIMIT_PER_SECOND": "100000",
    "RATE_LIMIT_BURST": "100000",
    # The fleet shares the load; a high pace keeps 5,000 sends within the time budget.
    "SEND_RATE_PER_INSTANCE": "200",
    "SEND_RATE_BURST": "50",
    # A killed worker's lease runs out in 40 s instead of 60 s (drains stay short). No shorter: a lease
    # must outlive a claim's worst case with these timeouts (messaging.sending.budget: 40 s, the check of
    # a lost answer's five look-ups), or start-up refuses it.
    "SEND_LEASE_SECONDS": "40",
    # A hung gateway is given up after 4 s (R6 timeouts); the simulator is local, 1 s to connect is plenty.
    "EVOLUTION_READ_TIMEOUT": "4",
    "EVOLUTION_CONNECT_TIMEOUT": "1",
    "TYPING_DELAY_MAX_MS": "0",
    "BREAKER_OPEN_SECONDS": "5",
    "TYPING_DELAY_MS_PER_CHAR": "0",
    # R9's callback receiver runs in the harness, on loopback (docs/security.md: for development and tests only).
    "CALLBACKS_ALLOW_PRIVATE_ADDRESSES": "true",
    "PILOT_TEST_STACK": "1",  # production mode refuses the line above elsewhere (pilot_status/production.py)
}


def start_simulator(log_name: str = "chaos-simulator") -> object:
    from pilot_status import topology
    from tests.support.processes import Process, free_port, simulator_site, wait_for_port
    from tests.support.simulator import SimulatorClient

    port = free_port()
    # Evolution's own per-event queues have no consumer here; filling them only loads RabbitMQ.
    argv = topology.process("simulator").command(simulator_site(port, "--no-declare-queues"))
    process = Process(log_name, argv, dict(os.environ)).start()
    wait_for_port(port, proc=process.proc)
    return SimulatorClient(f"http://127.0.0.1:{port}", process)


def start_stack(web_workers: int = 2) -> tuple[object, object, TcpProxy]:
    """(stack, simulator client, proxy); the stack reaches Evolution through the proxy. Its lane
    workers run as the Procfile's (pilot_status.lane_worker: LANE_WORKER_POOL, LANE_WORKER_CONCURRENCY*)."""
    from tests.support.processes import Stack
    from tests.support.simulator import SimulatorClient

    os.environ.update(CHAOS_ENV)
    sim = start_simulator()
    parsed = urlparse(sim.base_url)  # type: ignore[attr-defined]
    proxy = TcpProxy(parsed.hostname or "127.0.0.1", parsed.port or 80).start()
    stack = Stack(SimulatorClient(proxy.url), web_workers=web_workers)
    # The test stack gives up on a lock after 300 ms, so that a test's TRUNCATE never deadlocks with it;
    # nothing truncates under a chaos run, and a loaded host (a commit queued behind others, e.g. for the
    # NOTIFY lock, the likely wait; not confirmed) then answered a few sends 503. Chaos waits, as production.
    stack.env["DATABASE_LOCK_TIMEOUT_MS"] = "0"
    stack.start()
    return stack, sim, proxy


def webhook_pool_argv(port: int, workers: int = 2, threads: int = 4) -> list[str]:
    """The Procfile's `webhook` command (pilot_status/topology.py) on `port`, `workers` × `threads`, without
    the access log (S7 reads the pool's log for tracebacks)."""
    from pilot_status import topology

    pool = ("-w", str(workers), "--worker-class", "gthread", "--threads", str(threads))
    site = topology.stack_site(0, webhook_port=port, webhook_pool=pool, access_log=())
    return topology.process("webhook").command(site)


def start_webhook_pool(stack: object, workers: int = 2, threads: int = 4) -> tuple[object, str]:
    """The Procfile's `webhook` pool (pilot_status.internal_wsgi, gthread workers) next to the chaos
    stack, on the stack's database and settings: (process, base URL). The chaos stack itself is the
    single-pool deployment (web also serves /api/internal/), so the scenarios that judge both pools
    (S6, S7) start this one for their own run and stop it after."""
    from tests.support.processes import Process, free_port, wait_for_port

    port = free_port()
    process = Process("webhook", webhook_pool_argv(port, workers, threads), dict(stack.env)).start()  # type: ignore[attr-defined]
    wait_for_port(port, proc=process.proc)
    return process, f"http://127.0.0.1:{port}"
