"""The chaos run's actors: two tenants with fresh keys, an instance fleet, opt-ins, the simulator.

`python -m chaos` runs on its own database (CHAOS_DATABASE_NAME, else `<TEST_DATABASE_NAME>_chaos`),
created when missing; tests/chaos builds the same world on the test database of the `stack` fixture.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg

# Tables a scenario writes to; emptied before each scenario so that figures are the scenario's own.
SCENARIO_TABLES = (
    "messaging_messageevent",
    "messaging_outboxentry",
    "messaging_deadletter",
    "messaging_idempotencyrecord",
    "messaging_message",
    "evolution_ingestion_events",
    # R9 registers an endpoint (as bench B3 does): every scenario starts without one, without deliveries, and with
    # the callbacks relay's cursors at the start of the emptied, renumbered timeline.
    "callbacks_deliveryattempt",
    "callbacks_delivery",
    "callbacks_webhookendpoint",
    "callbacks_relaycursor",
)
FLEET = 8


def chaos_database_url(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ if env is None else env)
    parsed = urlparse(env["DATABASE_URL"])
    base = env.get("TEST_DATABASE_NAME") or parsed.path.lstrip("/") or "pilot_status"
    name = env.get("CHAOS_DATABASE_NAME") or f"{base}_chaos"
    return urlunparse(parsed._replace(path="/" + name))


def ensure_database(url: str) -> None:
    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    with psycopg.connect(urlunparse(parsed._replace(path="/postgres")), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')


def phone(i: int) -> str:
    return f"+55119{6000_0000 + i:08d}"  # valid Brazilian mobiles, +55 11 9xxxx-xxxx


@dataclass
class Tenant:
    project: Any
    live_key: str
    test_key: str
    instance: Any
    fleet: list[Any] = field(default_factory=list)
    recipients: list[str] = field(default_factory=list)


@dataclass
class World:
    a: Tenant  # the sender every fault scenario uses
    c: Tenant  # another tenant (S2)
    official: Any
    raw_secrets: list[str] = field(default_factory=list)  # every raw key/token handed out (S5)

    def instances(self) -> list[Any]:
        return [self.a.instance, *self.a.fleet, self.c.instance, self.official]


def build_world(recipients: int = 200) -> World:
    from messaging import operators, opt_ins
    from messaging.models import ApiKey, Environment, Instance, Project

    secrets: list[str] = []

    def tenant(name: str, instance_name: str, offset: int, fleet: int) -> Tenant:
        project = Project.objects.filter(name=name).first()
        if project is None:
            created = operators.create_project(name, phone(90_000 + offset), production_approved=True)
            project = Project.objects.get(pk=created["project_id"])
        # Fresh keys every run: raw keys are never stored, so old ones cannot be recovered.
        _, live = ApiKey.issue(project, Environment.LIVE)
        _, test = ApiKey.issue(project, Environment.TEST)
        secrets.extend([live, test])
        names = [instance_name] + [f"{instance_name}-{n:02d}" for n in range(1, fleet + 1)]
        names_made.extend(names)
        for n in names:
            if not Instance.objects.filter(name=n).exists():
                operators.add_instance(n, project.pk, priority=10 if n == instance_name else 50,
                                       token=f"TOKEN-{n}".upper())
        numbers = [phone(offset + i) for i in range(recipients)]
        live_optins = set(project.opt_ins.filter(revoked_at__isnull=True).values_list("phone", flat=True))
        for number in numbers:
            if number not in live_optins:
                opt_ins.record(project, number, "chaos")
        instances = {i.name: i for i in Instance.objects.filter(name__in=names)}
        return Tenant(project, live, test, instances[instance_name], [instances[n] for n in names[1:]], numbers)

    names_made: list[str] = []
    a = tenant("Chaos A", "chaos-a", 0, FLEET)
    c = tenant("Chaos C", "chaos-c", 10_000, 0)
    if not Instance.objects.filter(name="chaos-official").exists():
        operators.add_instance("chaos-official", None, official=True, priority=1, token="TOKEN-CHAOS-OFFICIAL")
    # The runs' numbers keep the throughput they were written for: Cloud API ones (the `official` profile).
    # Nor Meta's pair rate: a run sends many messages to each of its recipients.
    Instance.objects.filter(name__in=[*names_made, "chaos-official"]).update(
        send_profile="official", send_policy={"pair_gap_seconds": 0})
    official = Instance.objects.get(name="chaos-official")
    world = World(a, c, official, secrets)
    for made in world.instances():
        made.refresh_from_db(fields=["send_profile", "send_policy"])
    for instance in world.instances():
        world.raw_secrets.extend([instance.webhook_token, f"TOKEN-{instance.name}".upper()])
    return world


def empty_tables(tries: int = 10) -> None:
    """TRUNCATE the scenario tables (the shared helper retries while the stack holds locks)."""
    from tests.support.database import truncate_with_retry

    truncate_with_retry(SCENARIO_TABLES, tries)