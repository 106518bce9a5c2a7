"""The process topology, described once: `scripts/env.sh .venv/bin/python -m pilot_status.topology procfile > Procfile`.

Every long-running process of a deployment is one `Process` below: its command, the Celery queues it
works on, whether it runs at the background priority, where its concurrency comes from, and whether
it may be run more than once. Everything that starts processes reads them from here:

- the Procfile is generated from it (tests/pilot_status/test_topology.py checks the committed one);
- docker-compose.yml runs the same commands (the same test reads the YAML and compares);
- the bench (bench/launcher.py), the chaos stack (chaos/stack.py) and the test stack
  (tests/support/processes.py) take the commands from `Process.command`, filling in only their own
  `Site`: interpreter, ports, Celery node names, log level, and the simulator's arguments.

The lane workers' pool and concurrency are pilot_status.lane_worker's (the one launcher the lanes
start through); a stack that needs its own node name or Celery app runs what that launcher would exec
(`lane_worker_command`).

Nothing here imports Django or the Celery app, so a launcher may read it before choosing its settings
(the bench does: bench.settings). Importing the `pilot_status` package still sets the default
DJANGO_SETTINGS_MODULE, so such a launcher imports this module only once its own is set.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from pilot_status.priority import DEFAULT_BACKGROUND_NICE

if TYPE_CHECKING:
    from pilot_status.lane_worker import LaneWorker


@dataclass(frozen=True)
class Site:
    """What a launcher fills into the commands: the rest of every command is the description's."""

    host: str
    port: str  # web's
    webhook_port: str
    web_workers: str
    python: str | None = None  # None: programs by name, as PATH finds them; else this interpreter runs each
    graceful_timeout: str = "20"  # a stack stops its processes in seconds: it gives 5
    node: str = "%h"  # the Celery node name after `<queue>@`
    celery_app: str = "pilot_status"
    log_level: str = "info"
    webhook_pool: tuple[str, ...] = ("-w", "4", "--worker-class", "gthread", "--threads", "4")
    callbacks_threads: str = "${CALLBACKS_WORKER_CONCURRENCY:-8}"  # worker_callbacks' threads
    access_log: tuple[str, ...] = ("--access-logfile", "-")
    simulator_port: str = "8081"
    # `make run` and compose's demo: the instances seed_demo wrote, and no global webhook (each
    # instance has its own).
    simulator_args: tuple[str, ...] = ("--preload", ".state/simulator-instances.json", "--global-webhook-url", "")

    def program(self, name: str) -> list[str]:
        """How this site runs `gunicorn`, `celery` or `python`."""
        if self.python is None:
            return [name]
        return [self.python] if name == "python" else [self.python, "-m", name]


# `make run` (honcho): scripts/env.sh sets PORT, WEBHOOK_PORT (PORT+1) and WEB_CONCURRENCY (one per core).
PROCFILE = Site(host="127.0.0.1", port="$PORT", webhook_port="$WEBHOOK_PORT", web_workers="${WEB_CONCURRENCY:-2}")
# docker-compose.yml, as compose hands it to the container (after its own `$$` → `$`): web runs
# through `sh -c` for the nproc default.
COMPOSE = Site(host="0.0.0.0", port="8000", webhook_port="8001", web_workers="${WEB_CONCURRENCY:-$(nproc)}",
               callbacks_threads="8")


def stack_site(port: int | str, webhook_port: int | str = "", web_workers: int | str = 2, **rest: Any) -> Site:
    """A site for a stack started from Python (bench, chaos, tests): this interpreter, loopback, its own
    ports, and a 5 s graceful timeout (a stack stops its processes in seconds)."""
    site = Site(host="127.0.0.1", port=str(port), webhook_port=str(webhook_port), web_workers=str(web_workers),
                python=sys.executable, graceful_timeout="5", callbacks_threads="4")
    return replace(site, **rest)


_EXPAND = re.compile(r"^\{\*(\w+)\}$")


@dataclass(frozen=True)
class Process:
    name: str  # the Procfile's name; compose's and the stacks' is `service` (`_` → `-`)
    # The command: `{field}` is the Site's field, an argument `{*field}` expands to the Site's tuple.
    argv: tuple[str, ...]
    job: str
    queues: tuple[str, ...] = ()  # the Celery queues it consumes (workers) or feeds (relays)
    background: bool = True  # runs at BACKGROUND_NICE (compose: cpu_shares); the OTP path does not
    concurrency: str = "one"  # where its concurrency comes from
    scaling: Literal["horizontal", "single"] = "horizontal"  # single: a second copy would do the work twice
    ready: str | None = None  # what its log says once it works (a stack waits for it); None: see `listens`
    listens: str | None = None  # the Site field of the port it serves on
    stand_in: bool = False  # Evolution's stand-in: only with the local simulator (compose: the demo profile)

    @property
    def service(self) -> str:
        return self.name.replace("_", "-")

    @property
    def lane(self) -> str | None:
        """The lane of a lane worker (started through pilot_status.lane_worker)."""
        return self.argv[3] if self.argv[:3] == ("python", "-m", "pilot_status.lane_worker") else None

    def command(self, site: Site) -> list[str]:
        argv: list[str] = []
        for part in self.argv:
            expand = _EXPAND.match(part)
            if expand:
                value = getattr(site, expand.group(1))
                assert isinstance(value, tuple), part
                argv += value
            else:
                argv.append(part.format(**{name: getattr(site, name) for name in _fields(part)}))
        return [*site.program(argv[0]), *argv[1:]]


def _fields(template: str) -> list[str]:
    return re.findall(r"\{(\w+)\}", template)


def _gunicorn(app: str, port: str, pool: Sequence[str], *logging: str) -> tuple[str, ...]:
    return ("gunicorn", app, "-b", "{host}:{%s}" % port, *pool, "--timeout", "30", "--graceful-timeout",
            "{graceful_timeout}", "--keep-alive", "5", "{*access_log}", *logging)


def _celery_worker(queue: str) -> tuple[str, ...]:
    # One task at a time: every pass is long and keeps to its own time budget.
    return ("celery", "-A", "{celery_app}", "worker", "-Q", queue, "-n", f"{queue}@{{node}}", "-c", "1",
            "--prefetch-multiplier", "1", "-O", "fair", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-l", "{log_level}")


def _lane_worker(lane: str, background: bool) -> Process:
    return Process(
        f"worker_{lane}", ("python", "-m", "pilot_status.lane_worker", lane),
        f"sends the {lane} lane: one send attempt per task (messaging.sending.worker.send_one)",
        queues=(lane,), background=background, ready="ready.",
        concurrency=f"threads: LANE_WORKER_CONCURRENCY_{lane.upper()} (pilot_status.lane_worker)",
    )


def _relay(lanes: str | None) -> Process:
    return Process(
        "relay_otp" if lanes == "otp" else "relay",
        ("python", "manage.py", "run_relay", *(("--lanes", lanes) if lanes else ())),
        "moves due outbox rows to the lane queues (LISTEN/NOTIFY + 1 s poll)",
        queues=tuple(lanes.split(",")) if lanes else ("otp", "utility", "marketing"),
        background=lanes != "otp", ready="relay started", concurrency="one loop (rows taken SKIP LOCKED)",
    )


PROCESSES: tuple[Process, ...] = (
    Process("web", _gunicorn("pilot_status.wsgi:application", "port", ("-w", "{web_workers}")),
            "client API /v1/*, admin, dashboard (and /api/internal/webhook: one process is enough for a small deployment)",
            background=False, listens="port", concurrency="sync workers: WEB_CONCURRENCY (scripts/env.sh: one per core)"),
    Process("webhook", _gunicorn("pilot_status.internal_wsgi:application", "webhook_port", ("{*webhook_pool}",),
                                 "--logger-class", "pilot_status.access_log.FailedRequestsOnly"),
            "/api/internal/ only: Evolution's webhooks and the consumer's forwards, in a pool of their own",
            listens="webhook_port", concurrency="4 gthread workers × 4 threads"),
    _lane_worker("otp", background=False),
    _lane_worker("utility", background=True),
    _lane_worker("marketing", background=True),
    Process("worker_maintenance", _celery_worker("maintenance"),
            "database-only beat passes: lease recovery, lost releases, expiry, retention",
            queues=("maintenance",), ready="ready.", concurrency="one task at a time (-c 1)"),
    Process("worker_sync", _celery_worker("sync"),
            "beat passes that call out: status sync, instance poll, ingestion reconciler",
            queues=("sync",), ready="ready.", concurrency="one task at a time (-c 1)"),
    Process("worker_bulk", _celery_worker("bulk"), "the dashboard's bulk force-resends",
            queues=("bulk",), ready="ready.", concurrency="one task at a time (-c 1)"),
    Process("worker_callbacks", ("celery", "-A", "{celery_app}", "worker", "-Q", "callbacks,callbacks_relay",
                                 "-n", "callbacks@{node}",
                                 "-P", "threads", "-c", "{callbacks_threads}", "--prefetch-multiplier", "1", "-O", "fair",
                                 "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "{log_level}"),
            "the callbacks relay pass and the deliveries to customers' endpoints (callbacks app)",
            queues=("callbacks", "callbacks_relay"), ready="ready.",
            concurrency="threads: CALLBACKS_WORKER_CONCURRENCY (8), each with its own Postgres connection"),
    Process("beat", ("celery", "-A", "{celery_app}", "beat", "-l", "{log_level}",
                     "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler"),
            "schedules the maintenance tasks (django-celery-beat's DatabaseScheduler)",
            scaling="single", concurrency="one"),
    _relay("utility,marketing"),
    _relay("otp"),
    Process("consumer", ("python", "manage.py", "run_consumer"),
            "Evolution's RabbitMQ channel → inbox → forward to the webhook handler",
            ready="Connected to amqp", concurrency="one consuming loop"),
    Process("simulator", ("python", "-m", "simulator", "--host", "{host}", "--port", "{simulator_port}", "{*simulator_args}"),
            "a stand-in Evolution API (HTTP + webhooks + RabbitMQ)",
            background=False, stand_in=True, scaling="single", listens="simulator_port",
            concurrency="one (its instances live in its memory)"),
)
BY_NAME = {process.name: process for process in PROCESSES}
# One relay for every lane (run_relay without --lanes): the single-pool deployment's, which the test stack runs.
RELAY_ALL_LANES = replace(_relay(None), name="relay")


def process(name: str) -> Process:
    """A process by its Procfile name or its service name (`worker-otp`)."""
    return BY_NAME[name.replace("-", "_")]


def background_services() -> set[str]:
    """The processes that run at the background priority, by their service names."""
    return {p.service for p in PROCESSES if p.background}


def lane_worker_command(worker: LaneWorker, site: Site) -> list[str]:
    """What `python -m pilot_status.lane_worker <lane>` execs, with the site's node name, app and log level."""
    return [*site.program("celery"), *worker.celery_args(site.celery_app, f"{worker.lane}@{site.node}", site.log_level)]


def shell(argv: Sequence[str]) -> str:
    """A command line for honcho's shell; the Site's `$VARIABLES` stay for the shell to expand."""
    return " ".join(arg if "$" in arg else ('""' if arg == "" else shlex.quote(arg)) for arg in argv)


PROCFILE_HEADER = """\
# Generated from pilot_status/topology.py: edit that, then
#   scripts/env.sh .venv/bin/python -m pilot_status.topology procfile > Procfile
# (tests/pilot_status/test_topology.py fails while the two differ).
# honcho (make run). Every line runs from the repo root with scripts/env.sh's environment and
# the venv first on PATH. `make run` writes .state/Procfile from this file with
# scripts/procfile.sh, which drops `simulator` when EVOLUTION_API_URL is not the local simulator.
# web must stay first: honcho gives the first process PORT itself (the others get PORT+100, ...).
# webhook is its own pool on WEBHOOK_PORT (scripts/env.sh: PORT+1, fixed before honcho starts,
# like INTERNAL_WEBHOOK_URL which points at it): Evolution's webhooks and the consumer's forwards
# land there, so a storm of receipts never queues the client API behind it. Its app
# (pilot_status.internal_wsgi) serves /api/internal/ only, without the browser middleware, and it
# logs failed requests only (pilot_status/access_log.py). web still serves /api/internal/webhook
# too (a single-process deployment works unchanged).
# The webhook pool runs gthread workers: keep-alive for Evolution's and the consumer's pooled
# connections (a sync worker closes every connection and lingers until the client has closed
# too), and 16 requests in flight whose commits Postgres flushes together (bench B5: +25 %).
# The client API runs one sync worker per core (WEB_CONCURRENCY, scripts/env.sh: nproc). Its requests
# never wait on a broker or an HTTP call, only on Postgres and Redis, so they are CPU-bound: in bench B1's
# paired rounds on 2 cores (bench/findings.md), 2 workers accepted more sends than 4 in every round, at a
# lower p99, and the funnel at 2 workers ran at 0.73-0.87x the bare insert at 4 (its own best). A
# deployment that serves slow admin pages from this pool can raise it.
# Priorities: the client API and the OTP path (web, relay_otp, worker_otp) run first; every other
# process of ours is background work and runs through pilot_status.priority at BACKGROUND_NICE
# (default 10; 0 turns it off) and, where the host allows, in an idle CPU cgroup (BACKGROUND_IDLE_GROUP),
# so that a marketing drain and its receipts never make an OTP wait for a CPU (bench B3). `exec` keeps each process the leader of the session honcho gives it, which
# is what the priority is set on (pilot_status/priority.py says why).
# The lane workers (worker_otp/utility/marketing) start through pilot_status.lane_worker, the one place
# that sets their pool and concurrency (Celery's threads pool, LANE_WORKER_POOL / LANE_WORKER_CONCURRENCY*,
# sharing LANE_WORKER_DB_CONNECTIONS Postgres connections: a send waits on Evolution for 0.3-3 s plus its
# typing, and a waiting thread holds no core and no connection; issue 26). Tests, the bench, chaos and
# docker-compose start them the same way.
# Maintenance runs on three workers (pilot_status/celery.py, issue 22) so that no pass waits behind
# another kind: worker_maintenance (database-only passes: lease recovery, lost releases, expiry,
# retention), worker_sync (passes that call out: status sync, instance poll, ingestion reconciler),
# worker_bulk (the dashboard's bulk resends).
# worker_callbacks serves two queues (issue 23): `callbacks_relay`, the relay pass that writes deliveries
# from the timeline, the inbox and the opt-ins (beat, every CALLBACKS_RELAY_SECONDS), and `callbacks`,
# the deliveries to customers' endpoints (apart, so that a pass never waits behind a released batch).
# Threads: a delivery waits on someone else's server for up to
# CALLBACKS_TIMEOUT_SECONDS; each thread keeps its own Postgres connection (CALLBACKS_WORKER_CONCURRENCY, 8).
"""


def procfile_line(process: Process) -> str:
    command = shell(process.command(PROCFILE))
    if process.background:
        command = f"exec python -m pilot_status.priority ${{BACKGROUND_NICE:-{DEFAULT_BACKGROUND_NICE}}} {command}"
    return f"{process.name}: {command}"


def procfile() -> str:
    assert PROCESSES[0].name == "web"  # honcho gives the first process PORT itself
    return PROCFILE_HEADER + "".join(procfile_line(p) + "\n" for p in PROCESSES)


USAGE = "usage: python -m pilot_status.topology procfile"


def main(argv: list[str]) -> int:
    if argv != ["procfile"]:
        print(USAGE, file=sys.stderr)
        return 2
    sys.stdout.write(procfile())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
