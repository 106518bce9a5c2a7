"""The process topology, described once: `scripts/env.sh .venv/bin/python -m pilot_status.topology procfile > Procfile`.

Every long-running process of a deployment is one `Process` below: its command, the Celery queues it
works on, whether it is background work (its CPU priority is the deployment's: scripts/launch.sh under
`make run`, the slices of deploy/systemd, compose's cpu_shares), where its concurrency comes from, and
whether it may be run more than once. Everything that starts processes reads them from here:

- the Procfile and the systemd units in deploy/systemd are generated from it (tests/pilot_status/test_topology.py
  checks the committed ones);
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

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


# `make run`'s launcher (scripts/launch.sh): each process at its class's CPU priority; BACKGROUND_NICE's default.
LAUNCHER = "scripts/launch.sh"
DEFAULT_BACKGROUND_NICE = 10

_EXPAND = re.compile(r"^\{\*(\w+)\}$")


@dataclass(frozen=True)
class Process:
    name: str  # the Procfile's name; compose's and the stacks' is `service` (`_` → `-`)
    # The command: `{field}` is the Site's field, an argument `{*field}` expands to the Site's tuple.
    argv: tuple[str, ...]
    job: str
    queues: tuple[str, ...] = ()  # the Celery queues it consumes (workers) or feeds (relays)
    background: bool = True  # background work: the bulk slice, BACKGROUND_NICE, compose's cpu_shares; the OTP path is not
    concurrency: str = "one"  # where its concurrency comes from
    scaling: Literal["horizontal", "single"] = "horizontal"  # single: a second copy would do the work twice
    ready: str | None = None  # what its log says once it works (a stack waits for it); None: see `listens`
    listens: str | None = None  # the Site field of the port it serves on
    stand_in: bool = False  # Evolution's stand-in: only with the local simulator (compose: the demo profile)

    @property
    def service(self) -> str:
        return self.name.replace("_", "-")

    @property
    def launch_class(self) -> str | None:
        """scripts/launch.sh's class (and deploy/systemd's slice, pilot-status-<class>.slice); None: Evolution's
        stand-in, which is not ours to prioritise."""
        if self.stand_in:
            return None
        return "bulk" if self.background else "otp"

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
    Process("worker_callbacks", ("celery", "-A", "{celery_app}", "worker", "-Q", "callbacks",
                                 "-n", "callbacks@{node}",
                                 "-P", "threads", "-c", "{callbacks_threads}", "--prefetch-multiplier", "1", "-O", "fair",
                                 "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "{log_level}"),
            "the deliveries to customers' endpoints (callbacks app)",
            queues=("callbacks",), ready="ready.",
            concurrency="threads: CALLBACKS_WORKER_CONCURRENCY (8), each with its own Postgres connection"),
    Process("worker_callbacks_relay", _celery_worker("callbacks_relay"),
            "the callbacks relay pass: writes the deliveries owed and hands the due ones out (callbacks app)",
            queues=("callbacks_relay",), ready="ready.", concurrency="one task at a time (-c 1)"),
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
# (tests/pilot_status/test_topology.py fails while the two differ). Each process's job: docs/architecture.md,
# "Processes". honcho (make run) runs every line from the repo root with scripts/env.sh's environment and the
# venv first on PATH; `make run` drops `simulator` when EVOLUTION_API_URL is not the local simulator
# (scripts/procfile.sh).
# web must stay first: honcho gives the first process PORT itself (the others get PORT+100, ...).
# web runs one sync worker per core (WEB_CONCURRENCY): its requests wait on Postgres and Redis only, never on
# a broker or an HTTP call, so they are CPU-bound (bench/findings.md, "WEB_CONCURRENCY").
# webhook is its own pool on WEBHOOK_PORT (PORT+1), serving /api/internal/ only (pilot_status.internal_wsgi),
# so a storm of Evolution's receipts never queues the client API. gthread workers keep Evolution's and the
# consumer's connections alive, and its requests in flight share Postgres's commit flushes
# (bench/findings.md, "Webhook pool settings").
# Priorities are the deployment's: every process of ours starts through scripts/launch.sh, `otp` for the client
# API and the OTP path (web, relay_otp, worker_otp), `bulk` for the rest, which runs at BACKGROUND_NICE (default
# 10; 0: no nice) and, where systemd lets it, in a scope of the slice deploy/systemd weighs the same way. `exec`
# keeps each process its session's leader, whose priority the launcher sets too.
"""


def launched(process: Process, argv: list[str], launcher: str = LAUNCHER) -> list[str]:
    """The command as the launcher starts it at its class's priority (Evolution's stand-in: as it is)."""
    return argv if process.launch_class is None else [launcher, process.launch_class, *argv]


def procfile_line(process: Process) -> str:
    command = shell(launched(process, process.command(PROCFILE)))
    return f"{process.name}: {'exec ' if process.launch_class else ''}{command}"


def procfile() -> str:
    assert PROCESSES[0].name == "web"  # honcho gives the first process PORT itself
    return PROCFILE_HEADER + "".join(procfile_line(p) + "\n" for p in PROCESSES)


# deploy/systemd: a clone in /opt/pilot-status with its .venv (`make install`), the environment in
# /etc/pilot-status/env (deploy/systemd/README.md). `%%h` is
# Celery's host name once systemd has read its own `%%` as `%`.
SYSTEMD = Site(host="0.0.0.0", port="8000", webhook_port="8001", web_workers="${WEB_CONCURRENCY}", node="%%h",
               callbacks_threads="${CALLBACKS_WORKER_CONCURRENCY}", python="/opt/pilot-status/.venv/bin/python")
# Each launch class's slice and CPU weight (systemd's default is 100): the OTP path first, the bulk lanes,
# receipts and maintenance after anything else that wants a core. scripts/launch.sh uses the same weights.
SLICES = {
    "otp": ("the client API and the OTP path: first to a core", 1000),
    "bulk": ("bulk lanes, receipts, callbacks and maintenance: after anything else", 20),
}

SYSTEMD_SERVICE = """\
# Generated from pilot_status/topology.py (python -m pilot_status.topology systemd deploy/systemd).
[Unit]
Description=Pilot Status {name}: {job}
PartOf=pilot-status.target
After=network-online.target postgresql.service redis-server.service rabbitmq-server.service
Wants=network-online.target

[Service]
Type=simple
User=pilot-status
WorkingDirectory=/opt/pilot-status
Environment=PATH=/opt/pilot-status/.venv/bin:/usr/bin:/bin WEB_CONCURRENCY=2 CALLBACKS_WORKER_CONCURRENCY=8
Environment=DATABASE_APPLICATION_NAME={name}
EnvironmentFile=/etc/pilot-status/env
ExecStart={command}
Slice={slice}
Restart={restart}
RestartSec=2
KillSignal=SIGTERM
TimeoutStopSec=30

[Install]
WantedBy=pilot-status.target
"""

SYSTEMD_SLICE = """\
# Generated from pilot_status/topology.py (python -m pilot_status.topology systemd deploy/systemd).
[Unit]
Description=Pilot Status, {what}

[Slice]
CPUWeight={weight}
"""

SYSTEMD_TARGET = """\
# Generated from pilot_status/topology.py (python -m pilot_status.topology systemd deploy/systemd).
# `systemctl start pilot-status.target` starts every unit below; a machine that runs only some of them (the
# OTP lane's own machines, docs/scaling.md) enables those units alone.
[Unit]
Description=Pilot Status (every process of one machine)
Wants={units}

[Install]
WantedBy=multi-user.target
"""


def systemd_units() -> dict[str, str]:
    """deploy/systemd's files by name: one service per process of ours (beat's second copy exits with status 3, so
    it is not restarted), a slice per launch class, and the target that starts them."""
    units: dict[str, str] = {}
    for process in PROCESSES:
        if process.launch_class is None:
            continue
        command = " ".join(process.command(SYSTEMD)).replace("$(nproc)", "")
        units[f"pilot-status-{process.service}.service"] = SYSTEMD_SERVICE.format(
            name=process.name, job=process.job.replace("%", "%%"), command=command,
            slice=f"pilot-status-{process.launch_class}.slice",
            restart="on-failure" if process.scaling == "horizontal" else "on-abnormal")
    for name, (what, weight) in SLICES.items():
        units[f"pilot-status-{name}.slice"] = SYSTEMD_SLICE.format(what=what, weight=weight)
    services = " ".join(name for name in units if name.endswith(".service"))
    units["pilot-status.target"] = SYSTEMD_TARGET.format(units=services)
    return units


def write_systemd_units(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in systemd_units().items():
        (folder / name).write_text(text)


USAGE = "usage: python -m pilot_status.topology procfile | systemd FOLDER"


def main(argv: list[str]) -> int:
    if argv == ["procfile"]:
        sys.stdout.write(procfile())
        return 0
    if len(argv) == 2 and argv[0] == "systemd":
        write_systemd_units(Path(argv[1]))
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
