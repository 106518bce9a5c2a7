"""`python -m pilot_status.heartbeat_check --process NAME`: exit 0 when a process of that name on this host
has a fresh heartbeat (pilot_status.heartbeats), 1 otherwise (2: a usage error).

docker-compose's healthcheck for the relays, the consumer, the workers and beat, whose containers have no
HTTP port to probe. It reads REDIS_URL (or REDIS_URL_FILE) and HEARTBEAT_STALE_SECONDS from the environment
and loads no Django: about 0.3 s of CPU per check instead of 1.3 s for `manage.py heartbeat_check` (the
same check, for a shell with the project's settings)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from pilot_status import heartbeats


class Writer(Protocol):
    def write(self, text: str, /) -> Any: ...


def check(found: list[dict[str, Any]], name: str, host: str | None, max_age: float, out: Writer, err: Writer) -> int:
    """0 when `found` holds a heartbeat of `name` (from `host`, or any when None) younger than `max_age`."""
    now = time.time()
    ages = [now - float(beat["at"]) for beat in found if beat["process"] == name and host in (None, beat["host"])]
    if not ages:
        err.write(f"heartbeat_check: no heartbeat of {name} on {host or 'any host'}\n")
        return 1
    if min(ages) > max_age:
        err.write(f"heartbeat_check: {name}'s last heartbeat is {min(ages):.0f} s old (stale after {max_age:g} s)\n")
        return 1
    out.write(f"{name}: last heartbeat {min(ages):.1f} s ago\n")
    return 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Exit 0 when the named process on this host has a fresh heartbeat.")
    parser.add_argument("--process", required=True,
                        help="e.g. relay:otp, relay:utility,marketing, consumer, worker:otp, worker:maintenance, beat")
    parser.add_argument("--any-host", action="store_true", help="a heartbeat from any host counts")
    parser.add_argument("--max-age", type=float, default=None, help="seconds (default HEARTBEAT_STALE_SECONDS)")
    return parser


def _env(name: str) -> str:
    file_path = os.environ.get(f"{name}_FILE")
    return Path(file_path).read_text().strip() if file_path else os.environ.get(name, "")


def main(argv: list[str]) -> int:
    import redis

    args = parser().parse_args(argv)
    max_age = args.max_age if args.max_age is not None else float(
        _env("HEARTBEAT_STALE_SECONDS") or heartbeats.DEFAULT_STALE_SECONDS)
    try:
        client = redis.Redis.from_url(_env("REDIS_URL"), socket_connect_timeout=2, socket_timeout=2)
        found = heartbeats.processes(client=client, stale_after=max_age)
    except Exception as exc:
        sys.stderr.write(f"heartbeat_check: Redis unreadable ({exc.__class__.__name__}: {exc})\n")
        return 1
    return check(found, args.process, None if args.any_host else socket.gethostname(), max_age, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
