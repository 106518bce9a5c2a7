"""Production mode (DEBUG=0, issue 21): every process refuses, in one line naming the variable, a
secret that is missing, short or written in this repository, and `ALLOWED_HOSTS=*`; with the
documented production variables `manage.py check --deploy` has nothing to say."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from pilot_status import production
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]

# What docs/security.md tells an operator to set (besides the connection URLs, which the test
# environment already has): no transport variable, so the production defaults apply.
TRANSPORT = ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS",
             "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "SECURE_PROXY_SSL_HEADER")


def strong() -> str:
    return secrets.token_urlsafe(48)


def production_env(**overrides: str | None) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if name not in TRANSPORT and not name.endswith("_FILE")
           and name != "DJANGO_ALLOW_ASYNC_UNSAFE"  # the browser tests' (tests/dashboard/conftest.py), never a deployment's
           and name not in ("CALLBACKS_ALLOW_PRIVATE_ADDRESSES", "PILOT_TEST_STACK")}  # the test stacks' (scripts/env.sh)
    env.update(DEBUG="0", SECRET_KEY=strong(), INTERNAL_WEBHOOK_SECRET=strong(), METRICS_TOKEN=strong(),
               ALLOWED_HOSTS="pilot.example.com",
               SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https", DJANGO_SETTINGS_MODULE="pilot_status.settings")
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def assert_refused(result: subprocess.CompletedProcess[str], variable: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == production.EXIT_STATUS, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Refusing to start in production mode (DEBUG=0): ") and variable in lines[0]


@pytest.mark.parametrize("variable", production.SECRETS)
@pytest.mark.parametrize("value", sorted(production.PUBLISHED_SECRETS))
def test_it_refuses_every_secret_published_in_the_repository(variable, value):
    assert_refused(manage(production_env(**{variable: value}), "check"), variable)


@pytest.mark.parametrize("variable", production.SECRETS)
@pytest.mark.parametrize("value", [
    None,                                            # missing
    "",                                              # set but empty (compose's `VAR=` placeholder)
    secrets.token_hex(15) + "x",                     # 31 characters
    "ab" * 40,                                       # long, but two characters
    "my-changeme-" + secrets.token_hex(20),          # an edited placeholder
], ids=["missing", "empty", "short", "repetitive", "placeholder"])
def test_it_refuses_a_missing_short_or_weak_secret(variable, value):
    assert_refused(manage(production_env(**{variable: value}), "check"), variable)


def test_it_refuses_a_published_secret_given_as_a_file(tmp_path):
    secret_file = tmp_path / "secret_key"
    secret_file.write_text(sorted(production.PUBLISHED_SECRETS)[0] + "\n")
    assert_refused(manage(production_env(SECRET_KEY=None, SECRET_KEY_FILE=str(secret_file)), "check"), "SECRET_KEY")


def test_it_refuses_one_value_for_both_secrets():
    shared = strong()
    assert_refused(manage(production_env(SECRET_KEY=shared, INTERNAL_WEBHOOK_SECRET=shared), "check"),
                   "INTERNAL_WEBHOOK_SECRET")


@pytest.mark.parametrize("same_as", ["SECRET_KEY", "INTERNAL_WEBHOOK_SECRET"])
def test_it_refuses_a_metrics_token_that_is_one_of_the_secrets(same_as):
    # Prometheus's configuration holds METRICS_TOKEN (issue 24): it must open the metrics and nothing else.
    shared = strong()
    assert_refused(manage(production_env(**{same_as: shared, "METRICS_TOKEN": shared}), "check"), "METRICS_TOKEN")


@pytest.mark.parametrize("hosts", ["*", "pilot.example.com, *", "", None], ids=["star", "star-in-list", "empty", "missing"])
def test_it_refuses_any_host(hosts):
    assert_refused(manage(production_env(ALLOWED_HOSTS=hosts), "check"), "ALLOWED_HOSTS")


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_it_refuses_private_callback_addresses(value):
    # Every tenant could aim callbacks at this network: Postgres, Redis, the metadata service.
    assert_refused(manage(production_env(CALLBACKS_ALLOW_PRIVATE_ADDRESSES=value), "check"),
                   "CALLBACKS_ALLOW_PRIVATE_ADDRESSES")


def test_private_callback_addresses_stay_off_in_production_mode_and_open_in_development_and_test_stacks():
    assert manage(production_env(CALLBACKS_ALLOW_PRIVATE_ADDRESSES="false"), "check").returncode == 0
    assert manage(production_env(CALLBACKS_ALLOW_PRIVATE_ADDRESSES="true", DEBUG="1"), "check").returncode == 0
    # The test, bench and chaos stacks run production mode with receivers on loopback (scripts/env.sh).
    assert manage(production_env(CALLBACKS_ALLOW_PRIVATE_ADDRESSES="true", PILOT_TEST_STACK="1"), "check").returncode == 0


def test_strong_random_secrets_start():
    result = manage(production_env(), "check")
    assert result.returncode == 0, result.stderr


def test_development_mode_keeps_its_defaults():
    # DEBUG=1: no host list needed; the secrets still have to be there (README, "Set-up").
    result = manage(production_env(DEBUG="1", ALLOWED_HOSTS=None), "check")
    assert result.returncode == 0, result.stderr


def test_the_internal_webhook_host_is_allowed_for_our_own_forwards():
    # A one-process deployment: the consumer forwards to the web pool by its internal address.
    env = production_env(INTERNAL_WEBHOOK_URL="http://10.0.0.5:8000/api/internal/webhook")
    result = subprocess.run([sys.executable, "-c", "import django; django.setup(); from django.conf import settings;"
                             " print(','.join(settings.ALLOWED_HOSTS))"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "pilot.example.com,10.0.0.5", result.stderr


def test_plain_http_is_redirected_but_internal_forwards_are_not(db, settings):
    # Production defaults, in-process: the browser is sent to https, while the consumer's and the
    # reconciler's plain-HTTP forwards reach the webhook (as on the webhook pool, which never redirects).
    from django.test import Client

    settings.SECURE_SSL_REDIRECT = True
    plain = Client()
    response = plain.get("/dashboard/login/")
    assert response.status_code == 301 and response["Location"] == "https://testserver/dashboard/login/"
    response = plain.post("/api/internal/webhook", data="{}", content_type="application/json")
    assert response.status_code == 401 and response.json()["error"]["code"]  # answered, not redirected


def test_check_deploy_passes_with_the_documented_production_variables():
    result = manage(production_env(), "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_sees_the_plain_http_development_settings():
    # What scripts/env.sh sets for loopback (the test environment itself) is not a deployment.
    env = {**os.environ, "SECRET_KEY": strong(), "INTERNAL_WEBHOOK_SECRET": strong()}
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stderr


@pytest.mark.stack
@pytest.mark.parametrize("workers", [1, 2])
def test_gunicorn_stops_instead_of_respawning_failing_workers(workers):
    # Exit status 3 is gunicorn's "worker failed to boot": the master halts with our line instead of
    # forking new workers. (With several workers failing at once gunicorn 27 may meet the second
    # one's status while halting and exit 1 with a traceback of its own: it still stops.)
    env = production_env(SECRET_KEY=sorted(production.PUBLISHED_SECRETS)[0])
    result = subprocess.run([sys.executable, "-m", "gunicorn", "pilot_status.wsgi:application", "-b",
                             f"127.0.0.1:{free_port()}", "-w", str(workers), "--no-control-socket"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == production.EXIT_STATUS if workers == 1 else result.returncode != 0
    assert "Refusing to start in production mode (DEBUG=0): SECRET_KEY is a value published" in result.stderr
    assert "Worker failed to boot" in result.stderr
    assert result.stderr.count("Booting worker") == workers  # none forked again


# Where a secret's value could be written: `NAME=value`, `NAME: value`, `"NAME": "value"`, `${NAME:-value}`.
LITERAL = re.compile(r"\b(SECRET_KEY|INTERNAL_WEBHOOK_SECRET|METRICS_TOKEN)[\"']?\s*(?::-|[:=])\s*[\"']?([^\s\"'}$(),%\\]+)")


def shipped_literals() -> list[tuple[str, str, str]]:
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True)
    found = []
    for name in tracked.stdout.split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path.suffix in {".png", ".jpg", ".ico", ".gz"}:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for match in LITERAL.finditer(text):
            found.append((name, match.group(1), match.group(2)))
    return found


def test_every_secret_written_in_the_repository_is_refused():
    # A default, an example or a test value added anywhere later must be refused too: add it to
    # production.PUBLISHED_SECRETS (or make it a placeholder that fails the check).
    literals = shipped_literals()
    assert any(path == "pilot_status/settings/security.py" for path, _, _ in literals)  # the scan reads the tree
    accepted = [(path, variable, value) for path, variable, value in literals
                if production.secret_problem(variable, value) is None]
    assert not accepted


@pytest.mark.parametrize("value", ["short", "change-me-ops-status-token-0123456789"])
def test_it_refuses_a_weak_ops_status_token(value):
    # The status page's own credential (issue 24) follows the secrets' rules; unset, it is simply off.
    assert_refused(manage(production_env(OPS_STATUS_TOKEN=value), "check"), "OPS_STATUS_TOKEN")
    assert manage(production_env(OPS_STATUS_TOKEN=strong()), "check").returncode == 0
