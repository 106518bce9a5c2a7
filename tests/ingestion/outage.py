"""Really stop a shared service for a few seconds, and always start it again.

Postgres, Redis and RabbitMQ are shared with every other test run on this machine: keep the
body of `stopped(...)` short, and the service is started again on every path out of it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def services(action: str, name: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "services.sh"), action, name],
        check=True, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, timeout=120,
    )


def _postgres_env() -> dict[str, str]:
    # `start postgres` resets synchronous_commit unless PG_FAST=1: keep whatever `make test` chose.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        fast = cursor.fetchone()[0] == "off"
    return {"PG_FAST": "1"} if fast else {}


@contextmanager
def stopped(name: str) -> Iterator[None]:
    env = _postgres_env() if name == "postgres" else {}
    try:
        services("stop", name)
        yield
    finally:
        services("start", name, env)
        if name == "postgres":
            from django.db import connections

            # This process's connections died with the server: reconnect on next use.
            for conn in connections.all():
                conn.close()
