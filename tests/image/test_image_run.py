"""The built image against this checkout's Postgres, Redis and RabbitMQ on loopback (`make image-check`): its
migrations apply to an empty database, and a message travels accept → SENT → READ with web, the webhook pool, the
relay and the utility lane worker each started from the image (their commands are the topology's, as
docker-compose.yml runs them), the Evolution simulator of the test suite standing in for Evolution."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest
import requests
from django.db.migrations.loader import MigrationLoader

from messaging import opt_ins
from messaging.models import Message
from pilot_status import topology
from tests.support import processes as support
from tests.support.processes import Process, free_port, stop_all, wait_for_log, wait_for_port
from tests.support.simulator import wait_until

APP_UID = 10001


def uids_inside_the_image(pid: int) -> list[int]:
    """The real uid of every process below `pid` (seen from the host) that runs inside the image's root
    filesystem: buildah's and podman's own launchers run on the host's root, the image's command in its own."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    uids, pending = [], list(children.get(pid, []))
    while pending:
        child = pending.pop()
        pending += children.get(child, [])
        try:
            if os.readlink(f"/proc/{child}/root") == "/":
                continue
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:
            continue
        uids.append(int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1]))
    return uids


def database_url(name: str) -> str:
    return urlunparse(urlparse(support.test_database_url())._replace(path="/" + name))


def test_the_migrations_run_from_the_image(image):
    name = f"image_migrations_{os.getpid()}"
    admin = urlunparse(urlparse(support.test_database_url())._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        result = image.run(["python", "manage.py", "migrate", "--noinput"], env={**os.environ, "DATABASE_URL": database_url(name)})
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        with psycopg.connect(database_url(name)) as connection:
            applied = set(connection.execute("SELECT app, name FROM django_migrations").fetchall())
        on_disk = set(MigrationLoader(None, ignore_no_migrations=True).disk_migrations)
        assert on_disk and on_disk <= applied, sorted(on_disk - applied)
        print(f"\n{len(applied)} migrations applied from the image ({len(on_disk)} in this checkout)")
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def image_stack(image, transactional_db, simulator) -> Iterator[dict]:
    """web, webhook, relay (every lane) and worker_utility from the image, on the test database."""
    port, webhook_port = free_port(), free_port()
    site = topology.stack_site(port, webhook_port=webhook_port, python=None, node="image", access_log=())
    env = {**os.environ, "DATABASE_URL": support.test_database_url(), "EVOLUTION_API_URL": simulator.base_url,
           "PORT": str(port), "WEBHOOK_PORT": str(webhook_port),
           "INTERNAL_WEBHOOK_URL": f"http://127.0.0.1:{webhook_port}/api/internal/webhook", "RELAY_POLL_SECONDS": "0.5"}
    commands = {"web": topology.process("web").command(site), "webhook": topology.process("webhook").command(site),
                "relay": topology.RELAY_ALL_LANES.command(site),
                "worker-utility": topology.process("worker_utility").command(site)}
    processes = {name: Process(f"image-{name}", image.argv(command, env), env) for name, command in commands.items()}
    offsets = {name: (p.log.stat().st_size if p.log.exists() else 0) for name, p in processes.items()}
    for process in processes.values():
        process.start()
    try:
        wait_for_port(port, timeout=120, proc=processes["web"].proc)
        wait_for_port(webhook_port, timeout=120, proc=processes["webhook"].proc)
        wait_for_log(processes["worker-utility"].log, "ready.", timeout=120, proc=processes["worker-utility"].proc,
                     start_at=offsets["worker-utility"])
        wait_for_log(processes["relay"].log, "relay started", timeout=120, proc=processes["relay"].proc,
                     start_at=offsets["relay"])
        yield {"processes": processes, "web": f"http://127.0.0.1:{port}", "webhook": f"http://127.0.0.1:{webhook_port}",
               "env": env}
    finally:
        stop_all(processes.values(), timeout=20)


def test_a_message_travels_accept_sent_read_through_processes_started_from_the_image(
        image, image_stack, simulator, alice, alice_instance):
    web, webhook = image_stack["web"], image_stack["webhook"]
    for base in (web, webhook):
        assert requests.get(f"{base}/healthz", timeout=5).json() == {"status": "ok"}
        ready = requests.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
    # The image's own HEALTHCHECK command, in web's environment (as the container runs it), against web.
    probe = image.run(["sh", "-c", 'exec python -m pilot_status.probe "http://127.0.0.1:${PORT}/healthz"'],
                      env=image_stack["env"])
    assert probe.returncode == 0, probe.stdout + probe.stderr

    simulator.register(alice_instance, f"{webhook}/api/internal/webhook")
    opt_ins.record(alice.project, "+5511988887777", "signup form")
    response = requests.post(f"{web}/v1/messages/send", timeout=10,
                             json={"to": "+5511988887777", "category": "UTILITY", "text": "Image {{n}}", "variables": {"n": "7"}},
                             headers={"Authorization": f"Bearer {alice.live_key}"})
    assert response.status_code == 202, response.text
    message_id = response.json()["id"]
    message = wait_until(lambda: Message.objects.filter(pk=message_id, status="READ").first(), timeout=60, message="READ")
    assert [s["text"] for s in simulator.sends(instance=alice_instance.name)] == ["Image 7"]
    assert message.attempts == 1
    detail = requests.get(f"{web}/v1/messages/{message_id}", timeout=10,
                          headers={"Authorization": f"Bearer {alice.live_key}"}).json()
    statuses = [e["detail"].get("status") for e in detail["events"] if e["type"] == "STATUS"]
    assert detail["status"] == "READ" and statuses[0] == "SENT" and statuses[-1] == "READ", statuses

    # Every process of every container runs as `app`, none as root.
    for name, process in image_stack["processes"].items():
        assert process.alive(), f"{name} exited: {process.log.read_text()[-2000:]}"
        uids = uids_inside_the_image(process.proc.pid)
        assert uids and set(uids) == {APP_UID}, (name, uids)
