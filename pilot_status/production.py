"""Production mode (DEBUG=0): the start-up checks that refuse a configuration anyone could forge with.

A secret that is missing, short, or written anywhere in this repository (a default, an example, a
placeholder) lets whoever reads the repository sign sessions and forge `already_saved` forwards, so
every process refuses to start with it; so does `ALLOWED_HOSTS=*`. The refusal is one line on
stderr naming the variable, and the exit status is 3, which is also gunicorn's "worker failed to
boot": its master stops instead of forking new workers that fail the same way.

pilot_status/settings/security.py, which the settings package imports first, applies these rules
before anything else of the project is configured, so this module only uses the standard library.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

# Every value ever written in this repository for SECRET_KEY or INTERNAL_WEBHOOK_SECRET: the old
# defaults of scripts/env.sh, docker-compose.yml and .env.example. Keep a value here after it is
# removed from a file: old clones and copied .env files still hold it.
# tests/pilot_status/test_production_mode.py reads the shipped files and fails on a value missing here.
PUBLISHED_SECRETS = frozenset(
    {
        "dev-secret-key-change-me-in-production-0123456789",
        "dev-internal-secret-change-me",
        "change-me",
    }
)
# A value containing one of these is a placeholder someone edited, not a secret.
PLACEHOLDER_MARKERS = ("change-me", "changeme", "change_me", "replace-me", "replace_me", "insecure")
# METRICS_TOKEN: the scrape's own credential (pilot_status.scrape), so Prometheus never holds the internal secret.
SECRETS = ("SECRET_KEY", "INTERNAL_WEBHOOK_SECRET", "METRICS_TOKEN")
SECRET_MIN_LENGTH = 32
# Django's own deploy check (security.W009) asks for at least 5 distinct characters.
SECRET_MIN_DISTINCT = 5
EXIT_STATUS = 3
GENERATE = "python3 -c 'import secrets; print(secrets.token_urlsafe(48))'"


def secret_problem(name: str, value: str | None) -> str | None:
    """Why `value` cannot be `name` in production, or None."""
    if not value:
        return f"{name} is required (a random value of at least {SECRET_MIN_LENGTH} characters: {GENERATE})"
    if value.strip() in PUBLISHED_SECRETS or any(marker in value.lower() for marker in PLACEHOLDER_MARKERS):
        return f"{name} is a value published in this repository; set a new random one: {GENERATE}"
    if len(value) < SECRET_MIN_LENGTH:
        return f"{name} is {len(value)} characters long, at least {SECRET_MIN_LENGTH} are required: {GENERATE}"
    if len(set(value)) < SECRET_MIN_DISTINCT:
        return f"{name} repeats fewer than {SECRET_MIN_DISTINCT} distinct characters; set a random one: {GENERATE}"
    return None


def allowed_hosts_problem(value: str | None) -> str | None:
    hosts = [host.strip() for host in (value or "").split(",") if host.strip()]
    if not hosts:
        return "ALLOWED_HOSTS is required: the host names this service answers to, comma-separated"
    if "*" in hosts:
        return "ALLOWED_HOSTS must name the hosts this service answers to, not '*'"
    return None


def refusal(read: Callable[[str], str | None]) -> str | None:
    """The first reason this environment must not run in production mode, or None.

    `read(name)` returns a variable's value (pilot_status.envparse._raw: NAME_FILE first, then NAME).
    """
    values = {name: read(name) for name in SECRETS}
    for name in SECRETS:
        problem = secret_problem(name, values[name])
        if problem:
            return problem
    if values["SECRET_KEY"] == values["INTERNAL_WEBHOOK_SECRET"]:
        # The internal secret travels in a header on every forward; it must not also sign sessions.
        return "INTERNAL_WEBHOOK_SECRET must differ from SECRET_KEY"
    if values["METRICS_TOKEN"] in (values["SECRET_KEY"], values["INTERNAL_WEBHOOK_SECRET"]):
        # A scraper's configuration is read by more people than the application's.
        return "METRICS_TOKEN must differ from SECRET_KEY and INTERNAL_WEBHOOK_SECRET"
    return allowed_hosts_problem(read("ALLOWED_HOSTS")) or private_callbacks_problem(read)


TRUE = frozenset({"1", "true", "yes", "on"})  # as pilot_status.envparse.envbool reads them


def private_callbacks_problem(read: Callable[[str], str | None]) -> str | None:
    """CALLBACKS_ALLOW_PRIVATE_ADDRESSES lets every tenant aim callbacks at this network (Postgres,
    Redis, the cloud's metadata service). Production mode refuses it, except in the test, bench and chaos
    stacks, which run production mode with their receivers on loopback and say so with PILOT_TEST_STACK=1
    (scripts/env.sh --test, chaos/stack.py, bench/launcher.py)."""
    if (read("CALLBACKS_ALLOW_PRIVATE_ADDRESSES") or "").strip().lower() not in TRUE:
        return None
    if (read("PILOT_TEST_STACK") or "").strip().lower() in TRUE:
        return None
    return ("CALLBACKS_ALLOW_PRIVATE_ADDRESSES lets tenants' callbacks reach this network; "
            "it is for development (DEBUG=1) only")


def refuse(problem: str) -> NoReturn:
    print(f"Refusing to start in production mode (DEBUG=0): {problem}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_STATUS)
