"""Start-up refuses a malformed setting with a message naming it (README, "Set-up"), instead of failing later."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_up(**overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "pilot_status.settings", **overrides}
    return subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name, value, says", [
    ("RATE_LIMIT_PER_SECOND", "0", "RATE_LIMIT_PER_SECOND must be > 0"),
    ("RATE_LIMIT_PER_SECOND", "-5", "RATE_LIMIT_PER_SECOND must be > 0"),
    ("SEND_RATE_PER_INSTANCE", "nan", "SEND_RATE_PER_INSTANCE must be a finite number"),
    ("EVOLUTION_READ_TIMEOUT", "0", "EVOLUTION_READ_TIMEOUT must be > 0"),
    ("BREAKER_FAILURE_RATE", "1.5", "BREAKER_FAILURE_RATE must be <= 1"),
    ("RATE_LIMIT_BURST", "0", "RATE_LIMIT_BURST must be >= 1"),
    ("SEND_MAX_ATTEMPTS", "ten", "SEND_MAX_ATTEMPTS must be an integer"),
    ("CONSUMER_ACK_BATCH", "0", "CONSUMER_ACK_BATCH must be >= 1"),
    ("CONSUMER_ACK_BATCH", "101", "CONSUMER_ACK_BATCH must be at most 100 (the consumer's prefetch)"),
    ("EVOLUTION_RABBITMQ_PER_INSTANCE", "maybe", "EVOLUTION_RABBITMQ_PER_INSTANCE must be a boolean"),
    ("METRICS_FLUSH_SECONDS", "-1", "METRICS_FLUSH_SECONDS must be >= 0"),
])
def test_a_malformed_number_stops_start_up_and_names_the_setting(name, value, says):
    result = start_up(**{name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and says in result.stderr


def test_the_defaults_start():
    result = start_up()
    assert result.returncode == 0, result.stderr


_APPLICATION_NAME = """
import django; django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SELECT current_setting('application_name')")
    print(cursor.fetchone()[0])
"""


@pytest.mark.slow
@pytest.mark.parametrize("given, shown", [
    ({"DATABASE_APPLICATION_NAME": "webhook"}, "webhook"),  # deploy/systemd, the bench
    ({"HONCHO_PROCESS_NAME": "consumer.1"}, "consumer.1"),  # make run
    ({"DATABASE_APPLICATION_NAME": "relay", "HONCHO_PROCESS_NAME": "relay.1"}, "relay"),
])
def test_a_process_names_its_sessions_in_pg_stat_activity(db, given, shown):
    from tests.support.processes import test_database_url

    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_APPLICATION_NAME", "HONCHO_PROCESS_NAME", "PGAPPNAME")}
    env.update(DJANGO_SETTINGS_MODULE="pilot_status.settings", DATABASE_URL=test_database_url(), **given)
    result = subprocess.run([sys.executable, "-c", _APPLICATION_NAME], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == shown
