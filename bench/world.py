"""The bench's database and its actors: projects, keys, instances, opt-ins, simulator registration.

The bench runs on its own database (never the development or the test one): BENCH_DATABASE_NAME,
or `<TEST_DATABASE_NAME or the DATABASE_URL's name>_bench`. It is created when missing, migrated,
and emptied between scenarios.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg
import requests

# Every table a scenario writes to; emptied between scenarios so that each starts from the same state.
SCENARIO_TABLES = (
    "messaging_messageevent",
    "messaging_outboxentry",
    "messaging_deadletter",
    "messaging_idempotencyrecord",
    "messaging_message",
    "evolution_ingestion_events",
    "bench_baseline_baselinerow",
    # B3 registers an endpoint for each of its runs (bench.callbacks_on); every run starts without one,
    # without deliveries, and with the callbacks relay's cursors at the start of the (emptied, renumbered) tables.
    "callbacks_deliveryattempt",
    "callbacks_delivery",
    "callbacks_webhookendpoint",
    "callbacks_relaycursor",
)


def bench_database_url(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ if env is None else env)
    parsed = urlparse(env["DATABASE_URL"])
    base = env.get("TEST_DATABASE_NAME") or parsed.path.lstrip("/") or "pilot_status"
    name = env.get("BENCH_DATABASE_NAME") or f"{base}_bench"
    return urlunparse(parsed._replace(path="/" + name))


def ensure_database(url: str) -> None:
    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin = urlunparse(parsed._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def empty_tables(tries: int = 30) -> None:
    """TRUNCATE the scenario tables (the shared helper retries while the stack holds locks).

    The previous run's receipts may still be in flight: with a lock timeout under Postgres'
    deadlock_timeout the TRUNCATE steps back and retries, instead of deadlocking with them and
    turning their webhooks into 503s (which the simulator then retries into the next run)."""
    from tests.support.database import truncate_with_retry

    truncate_with_retry(SCENARIO_TABLES, tries, lock_timeout="300ms")


def phone(i: int) -> str:
    # Valid Brazilian mobile numbers: +55 11 9xxxx-xxxx.
    return f"+55119{7000_0000 + i:08d}"


@dataclass
class Actor:
    project: Any
    live_key: str
    instance: Any
    recipients: list[str] = field(default_factory=list)


@dataclass
class World:
    a: Actor  # the big sender (backlogs); also owns the fleet
    b: Actor  # the small sender (B6's later 500)
    official: Any  # Pilot Status' official instance (OTP without opt-in)
    # A's many numbers: per-instance pacing (SEND_RATE_PER_INSTANCE) caps one instance far below
    # what the machine can do, so throughput scenarios spread their messages over a fleet.
    fleet: list[Any] = field(default_factory=list)
    # Numbers without an opt-in: their OTPs go through the official instance (rules.resolve_instance).
    otp_recipients: list[str] = field(default_factory=lambda: [phone(5_000 + i) for i in range(50)])


def build_world(recipients: int = 50, fleet: int = 60) -> World:
    """Create (or reuse) the bench's projects; safe to run on every bench start."""
    from messaging import operators, opt_ins
    from messaging.models import ApiKey, Environment, Instance, Project

    def actor(name: str, instance_name: str, offset: int) -> Actor:
        project = Project.objects.filter(name=name).first()
        if project is None:
            created = operators.create_project(name, phone(9_000 + offset), production_approved=True)
            project = Project.objects.get(pk=created["project_id"])
        # A fresh live key per run: raw keys are never stored, so the old ones cannot be reused.
        _, raw = ApiKey.issue(project, Environment.LIVE)
        instance = Instance.objects.filter(name=instance_name).first()
        if instance is None:
            operators.add_instance(instance_name, project.pk, priority=10, token=f"TOKEN-{instance_name}")
            instance = Instance.objects.get(name=instance_name)
        numbers = [phone(offset + i) for i in range(recipients)]
        live = set(project.opt_ins.filter(revoked_at__isnull=True).values_list("phone", flat=True))
        for number in numbers:
            if number not in live:
                opt_ins.record(project, number, "bench")
        return Actor(project, raw, instance, numbers)

    a = actor("Bench A", "bench-a", 0)
    b = actor("Bench B", "bench-b", 1_000)
    official = Instance.objects.filter(name="bench-official").first()
    if official is None:
        operators.add_instance("bench-official", None, official=True, priority=1, token="TOKEN-BENCH-OFFICIAL")
        official = Instance.objects.get(name="bench-official")
    names = [f"bench-a-{n:03d}" for n in range(1, fleet + 1)]
    existing = set(Instance.objects.filter(name__in=names).values_list("name", flat=True))
    for name in names:
        if name not in existing:
            operators.add_instance(name, a.project.pk, priority=50, token=f"TOKEN-{name}")
    # The benches measure the product's throughput: every number is a Cloud API one (its `official` profile);
    # an unofficial number's human pace is measured on its own (docs/sending-policy.md).
    # Nor Meta's pair rate: a bench sends dozens of messages to each of its few recipients.
    Instance.objects.update(connection_state="open", send_profile="official", send_policy={"pair_gap_seconds": 0})
    for made in (a.instance, b.instance, official):
        made.refresh_from_db(fields=["connection_state", "send_profile", "send_policy"])
    return World(a, b, official, fleet=list(Instance.objects.filter(name__in=names).order_by("name")))


class Simulator:
    """The simulator's control API (simulator/README.md), only what the bench needs."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.http = requests.Session()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self.http.post(f"{self.base_url}{path}", json=body or {}, timeout=30)
        response.raise_for_status()
        return response.json()

    def reset(self) -> None:
        self._post("/_control/reset")

    def reset_global(self) -> None:
        """Back to the simulator's start-up settings (RabbitMQ mode, global webhook) as well."""
        self._post("/_control/reset", {"global": True})

    def configure(self, name: str, **config: Any) -> Any:
        return self._post(f"/_control/instances/{name}", config)

    def register(self, instance: Any, webhook_url: str, ack_delays_ms: dict[str, float | None] | None = None) -> Any:
        return self.configure(
            instance.name,
            state="open",
            webhook={
                "enabled": True,
                "url": webhook_url,
                "byEvents": False,
                "headers": {"x-webhook-token": instance.webhook_token},
                "events": [],
            },
            faults={"ack_delays_ms": ack_delays_ms or {"SERVER_ACK": 5, "DELIVERY_ACK": 10, "READ": 15}},
        )

    def instance(self, name: str) -> dict[str, Any]:
        response = self.http.get(f"{self.base_url}/_control/instances/{name}", timeout=30)
        response.raise_for_status()
        return dict(response.json())

    def sends(self, instance: str | None = None) -> list[dict[str, Any]]:
        """The sendText calls the simulator still remembers for `instance` (every instance's without one; its
        records, oldest first)."""
        params = {"instance": instance} if instance else {}
        response = self.http.get(f"{self.base_url}/_control/sends", params=params, timeout=30)
        response.raise_for_status()
        return list(response.json())

    def emit(self, instance: str, event: str, data: dict[str, Any]) -> Any:
        return self._post("/_control/emit", {"instance": instance, "event": event, "data": data})

    def stats(self) -> dict[str, Any]:
        response = self.http.get(f"{self.base_url}/_control/stats", timeout=30)
        response.raise_for_status()
        return dict(response.json())

    def set_global(self, **config: Any) -> Any:
        return self._post("/_control/global", config)


def register_all(sim: Simulator, world: World, webhook_url: str, **kwargs: Any) -> None:
    sim.reset()
    for instance in (world.a.instance, world.b.instance, world.official, *world.fleet):
        sim.register(instance, webhook_url, **kwargs)
