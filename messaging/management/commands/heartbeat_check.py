"""`manage.py heartbeat_check --process NAME`: exit 0 when a process of that name on this host has a fresh
heartbeat, 1 otherwise; `python -m pilot_status.heartbeat_check` is the same check without Django (compose)."""

from __future__ import annotations

import socket
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from pilot_status import heartbeats
from pilot_status.heartbeat_check import check


class Command(BaseCommand):
    help = "Exit 0 when the named process on this host has a fresh heartbeat in Redis, 1 otherwise."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--process", required=True,
            help="e.g. relay:otp, relay:utility,marketing, consumer, worker:otp, worker:maintenance, beat",
        )
        parser.add_argument("--any-host", action="store_true", help="a heartbeat from any host counts")
        parser.add_argument("--max-age", type=float, default=None, help="seconds (default HEARTBEAT_STALE_SECONDS)")

    def handle(self, *args: Any, **options: Any) -> None:
        max_age = options["max_age"] if options["max_age"] is not None else settings.HEARTBEAT_STALE_SECONDS
        try:
            found = heartbeats.processes(stale_after=max_age)
        except Exception as exc:
            self.stderr.write(f"heartbeat_check: Redis unreadable ({exc.__class__.__name__}: {exc})")
            sys.exit(1)
        host = None if options["any_host"] else socket.gethostname()
        status = check(found, options["process"], host, max_age, self.stdout, self.stderr)
        if status:
            sys.exit(status)
