"""Really stop and start the shared servers, or put RabbitMQ into a fault (scripts/services.sh), for fault tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from .processes import ROOT
from .simulator import wait_until


def service(action: str, name: str) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "services.sh"), action, name],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        timeout=180,
    )


@contextmanager
def stopped(*names: str) -> Iterator[None]:
    """Stop the named services for the duration of the block; always start them again."""
    try:
        for name in names:
            service("stop", name)
        yield
    finally:
        for name in names:
            service("start", name)


def rabbitmqctl(*args: str) -> str:
    """rabbitmqctl for the shared node (through scripts/services.sh, which knows its environment)."""
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "services.sh"), "rabbitmqctl", *args],
        check=True, cwd=ROOT, capture_output=True, text=True, timeout=120,
    ).stdout


def _memory_alarm_on() -> bool:
    return "memory" in rabbitmqctl("eval", "rabbit_alarm:get_alarms().")


@contextmanager
def memory_alarm() -> Iterator[None]:
    """RabbitMQ's memory alarm for the block: the broker stops reading from every publishing connection."""
    try:
        rabbitmqctl("set_vm_memory_high_watermark", "0")
        wait_until(_memory_alarm_on, timeout=30, interval=0.2, message="RabbitMQ's memory alarm")
        yield
    finally:
        rabbitmqctl("set_vm_memory_high_watermark", "0.4")  # RabbitMQ's default; services.sh sets none
        wait_until(lambda: not _memory_alarm_on(), timeout=30, interval=0.2, message="the memory alarm to clear")


@contextmanager
def queue_policy(vhost: str, pattern: str, definition: str) -> Iterator[None]:
    """A RabbitMQ policy on the queues matching `pattern` for the block (e.g. a length limit)."""
    name = "pilot-status-test"
    rabbitmqctl("set_policy", "-p", vhost, "--apply-to", "queues", "--priority", "100", name, pattern, definition)
    try:
        yield
    finally:
        rabbitmqctl("clear_policy", "-p", vhost, name)


def close_broker_connection(client_port: int) -> None:
    """RabbitMQ closes the one client connection that comes from this local port (as an operator would)."""
    for line in rabbitmqctl("list_connections", "pid", "peer_port", "--no-table-headers", "-q").splitlines():
        pid, _, port = line.strip().rpartition("\t")
        if port == str(client_port):
            rabbitmqctl("close_connection", pid, "closed by a test")
            return
    raise AssertionError(f"no broker connection from port {client_port}")
