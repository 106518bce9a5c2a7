"""`manage.py heartbeat_check --process NAME`: exit 0 when a process of that name on this host has a fresh
heartbeat (pilot_status.heartbeats), 1 otherwise. docker-compose's healthchecks for the relays, the
consumer, the workers and beat (whose containers have no HTTP port to probe)."""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from pilot_status import heartbeats


class Command(BaseCommand):
    help = "Exit 0 when the named process on this host has a fresh heartbeat in Redis, 1 otherwise."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--process", required=True,
            help="e.g. relay:otp, relay:utility,marketing, consumer, worker:otp, worker:maintenance, beat",
        )
        parser.add_argument("--any-host", action="store_true", help="a heartbeat from any host counts")
        parser.add_argument(
            "--max-age", type=float, default=None,
            help="seconds (default HEARTBEAT_STALE_SECONDS)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name, host = options["process"], socket.gethostname()
        max_age = options["max_age"] if options["max_age"] is not None else settings.HEARTBEAT_STALE_SECONDS
        try:
            found = heartbeats.processes()
        except Exception as exc:
            self.stderr.write(f"heartbeat_check: Redis unreadable ({exc.__class__.__name__}: {exc})")
            sys.exit(1)
        now = time.time()
        ages = [
            now - float(beat["at"]) for beat in found
            if beat["process"] == name and (options["any_host"] or beat["host"] == host)
        ]
        if not ages:
            self.stderr.write(f"heartbeat_check: no heartbeat of {name} on {'any host' if options['any_host'] else host}")
            sys.exit(1)
        if min(ages) > max_age:
            self.stderr.write(f"heartbeat_check: {name}'s last heartbeat is {min(ages):.0f} s old (stale after {max_age:g} s)")
            sys.exit(1)
        self.stdout.write(f"{name}: last heartbeat {min(ages):.1f} s ago")
