"""seed_demo (`make run`'s demo, issue 21): never in production mode unless told it is a demo, and what
it makes can never stand in for a real deployment: not production-approved, no LIVE key printed,
instances ranked after every real one."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from messaging import operators
from messaging.management.commands.seed_demo import DEMO_FLAG, DEMO_NAME, DEMO_PRIORITY, OFFICIAL_INSTANCE, OWN_INSTANCE
from messaging.models import Instance, Project


def seed(tmp_path, *flags: str) -> str:
    out = StringIO()
    call_command("seed_demo", "--state-dir", str(tmp_path), *flags, stdout=out)
    return out.getvalue()


def test_it_refuses_production_mode_without_the_flag(db, settings, tmp_path):
    settings.DEBUG = False
    with pytest.raises(CommandError, match="production mode"):
        seed(tmp_path)
    assert not Project.objects.exists() and not Instance.objects.exists()
    assert not (tmp_path / "demo.json").exists()


def test_the_demo_is_not_production_approved_and_prints_no_live_key(db, settings, tmp_path):
    settings.DEBUG = False
    printed = seed(tmp_path, DEMO_FLAG)
    project = Project.objects.get(name=DEMO_NAME)
    saved = json.loads((tmp_path / "demo.json").read_text())
    assert not project.production_approved
    assert saved["test_api_key"] in printed and saved["live_api_key"] not in printed
    assert (tmp_path / "demo.json").stat().st_mode & 0o777 == 0o600
    for instance in Instance.objects.all():
        assert f"webhook token of {instance.name} (x-webhook-token): {instance.webhook_token}" in printed
    preload = json.loads((tmp_path / "simulator-instances.json").read_text())
    assert {row["webhook"]["headers"]["x-webhook-token"] for row in preload} == {
        instance.webhook_token for instance in Instance.objects.all()}


def test_a_real_instance_outranks_the_demo_ones(db, settings, tmp_path):
    settings.DEBUG = True  # development: no flag needed
    seed(tmp_path)
    operators.add_instance("real-official", official=True)  # default priority
    official = Instance.objects.filter(is_official=True)
    assert official.first().name == "real-official"  # Meta.ordering: priority, then pk
    assert set(Instance.objects.filter(priority=DEMO_PRIORITY).values_list("name", flat=True)) == {
        OWN_INSTANCE, OFFICIAL_INSTANCE}


def test_a_demo_seeded_before_is_downgraded(db, settings, tmp_path):
    settings.DEBUG = True
    seed(tmp_path)
    # As seed_demo made it before issue 21: approved, instances at priority 10.
    Project.objects.filter(name=DEMO_NAME).update(production_approved=True)
    Instance.objects.update(priority=10)
    seed(tmp_path)
    assert not Project.objects.get(name=DEMO_NAME).production_approved
    assert set(Instance.objects.values_list("priority", flat=True)) == {DEMO_PRIORITY}
