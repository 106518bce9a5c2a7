"""Each pytest-xdist worker's own share of the test servers, so that `make test` can run workers side by side.

A worker (gw0, gw1, ...) gets:
- its own database: pytest-django's `test_pilot_status_gw0`, ...;
- its own Redis database (REDIS_URL's db FIRST_WORKER_REDIS_DB + n; a run without xdist keeps db 1);
- its own RabbitMQ vhost (`pilot_test_gw0`, ...), for Celery's tasks and Evolution's events alike, created
  on first use;
- its own folder of process logs (artifacts/logs/gw0/) and its own block of ports (`port_block`).

Everything here is environment: tests/support/plugin.py applies it before pytest-django reads the settings,
and every process a test starts inherits it. Nothing here imports Django.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
# Redis has 16 databases (0-15): db 0 is `make run`'s, db 1 a run without xdist's.
FIRST_WORKER_REDIS_DB = 2
MAX_WORKERS = 16 - FIRST_WORKER_REDIS_DB
BROKER_URLS = ("CELERY_BROKER_URL", "EVOLUTION_RABBITMQ_URL", "SIMULATOR_TEST_RABBITMQ_URL")
# Ports for the processes tests start: below Linux's ephemeral range (32768-60999), where no outgoing
# connection is ever given one as its local port, and one block per clone and per worker.
PORTS_FROM = 20000
PORTS_PER_CLONE = 1024
PORTS_PER_WORKER = 64


def worker_id() -> str:
    """"gw0", "gw1", ... in a pytest-xdist worker (xdist sets it before the worker reads its configuration);
    "" otherwise."""
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def worker_index() -> int | None:
    worker = worker_id()
    return int(worker.removeprefix("gw")) if worker else None


def with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def vhost_of(url: str) -> str:
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def with_vhost(url: str, vhost: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + quote(vhost, safe="")))


def worker_vhost(vhost: str, worker: str) -> str:
    return f"{vhost}_{worker}" if vhost != "/" else worker


def worker_environment(environ: dict[str, str], worker: str) -> dict[str, str]:
    """The variables that give `worker` its own Redis database and vhosts, from the run's own."""
    index = int(worker.removeprefix("gw"))
    if index >= MAX_WORKERS:
        raise RuntimeError(f"at most {MAX_WORKERS} xdist workers: Redis has a database for each of them only")
    changed: dict[str, str] = {}
    if environ.get("REDIS_URL"):
        changed["REDIS_URL"] = with_redis_db(environ["REDIS_URL"], FIRST_WORKER_REDIS_DB + index)
    for name in BROKER_URLS:
        url = environ.get(name)
        if url and urlsplit(url).scheme.startswith("amqp"):
            changed[name] = with_vhost(url, worker_vhost(vhost_of(url), worker))
    return changed


def clone_offset() -> int:
    """This clone's port offset (scripts/services.sh choose_ports: 0, 100, ..., 900), as scripts/env.sh reads it."""
    path = ROOT / ".state" / "port-offset"
    digits = "".join(ch for ch in path.read_text() if ch.isdigit()) if path.exists() else ""
    return int(digits or 0)


def port_block() -> range:
    """The ports this process hands out to the processes it starts: a block of its own per clone and per
    worker (a run without xdist has block 0), so that two workers, or two clones' runs, never pick the same."""
    index = worker_index()
    start = PORTS_FROM + (clone_offset() // 100) * PORTS_PER_CLONE + (0 if index is None else index + 1) * PORTS_PER_WORKER
    return range(start, start + PORTS_PER_WORKER)


def ensure_vhosts(environ: dict[str, str]) -> None:
    """Create the vhosts the broker URLs name when the broker refuses them (first run of a worker number)."""
    import amqp

    for url in sorted({environ[name] for name in BROKER_URLS if environ.get(name, "").startswith("amqp")}):
        parts = urlsplit(url)
        try:
            connection = amqp.Connection(host=f"{parts.hostname}:{parts.port or 5672}", userid=unquote(parts.username or "guest"),
                                         password=unquote(parts.password or "guest"), virtual_host=vhost_of(url),
                                         connect_timeout=5)
            connection.connect()
            connection.close()
            continue
        except amqp.exceptions.NotAllowed:
            pass
        except OSError:
            continue  # no broker at all: the tests that need one say so
        vhost, user = vhost_of(url), unquote(parts.username or "guest")
        for args in (["add_vhost", vhost], ["set_permissions", "-p", vhost, user, ".*", ".*", ".*"]):
            done = subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), "rabbitmqctl", "-q", *args],
                                  cwd=ROOT, capture_output=True, text=True, timeout=120)
            if done.returncode != 0 and "already exists" not in done.stderr + done.stdout:
                raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr or done.stdout}")
