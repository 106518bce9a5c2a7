"""Django's core: apps, middleware, templates, the database, the cache, Celery's broker, the client API, static
files, logging, time, and the processes' health (heartbeats, readiness, counters)."""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from ..envparse import envfloat, envint, envstr, envurl
from .security import DEBUG
from messaging.sending.budget import DB_POOL_WAIT_SECONDS

BASE_DIR = Path(__file__).resolve().parent.parent.parent


INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    # Swagger UI's files for /v1/docs/, served by WhiteNoise from this app: no CDN (issue 24).
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "axes",  # sign-in throttling for the dashboard and admin (see LOGIN_FAILURE_LIMIT in security.py)
    "messaging",
    "ingestion",
    "dashboard",
    "callbacks",
]

MIDDLEWARE = [
    # /healthz and /readyz, answered before anything else: no HTTPS redirect, no host check (a
    # probe names the pod's address), no session (pilot_status/health.py).
    "pilot_status.health.ProbeMiddleware",
    "pilot_status.middleware.JsonErrorMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's CSS/JS from the app folders under gunicorn (no collectstatic needed).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Admin pages: malformed ids, NUL, out-of-calendar dates and huge searches get a 400 (issue 21).
    "pilot_status.admin_guard.AdminInputGuard",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Turns a locked-out sign-in into the lockout page; last (axes' docs), so the outer middleware (security
    # headers, X-Frame-Options) also apply to that page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "pilot_status.urls"
WSGI_APPLICATION = "pilot_status.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The Postgres database, the source of truth (postgres://user:password@host:port/name).
DATABASE_URL = envurl("DATABASE_URL", ("postgres", "postgresql"))
DATABASES = {
    # Persistent connections: opening a connection per request costs more than the request's own queries.
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
}
DATABASES["default"].setdefault("OPTIONS", {})
# A dead database must fail fast (the API answers 503) instead of hanging a worker.
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", envint("DATABASE_CONNECT_TIMEOUT", 3))
# Prepared statements for the few statements that run once or more per message (messaging.prepared:
# accepting, claiming, a send's result, a receipt): server-side binding, prepared on first use on each
# connection. Django's own cursors bind parameters client-side and are never prepared.
DATABASES["default"]["OPTIONS"].setdefault("prepare_threshold", 5)  # lets a cursor ask (Django: None)
# Optional: give up on a lock after this many ms instead of queueing behind it (0 = wait). Every
# background step here retries, so failing fast beats piling up behind a long DDL or TRUNCATE.
_LOCK_TIMEOUT_MS = envint("DATABASE_LOCK_TIMEOUT_MS", 0, minimum=0)
# No JIT compilation: it pays off for long analytical queries, and every statement here is short. The
# relay's turn query over a large backlog is estimated past jit_above_cost and would spend far longer
# compiling than running, on every pass (tests/messaging/test_relay_plans.py).
_SESSION_SETTINGS = ["-c jit=off"] + ([f"-c lock_timeout={_LOCK_TIMEOUT_MS}"] if _LOCK_TIMEOUT_MS else [])
DATABASES["default"]["OPTIONS"]["options"] = " ".join(_SESSION_SETTINGS)
# The name this process's sessions carry in pg_stat_activity (application_name), so that an operator sees which
# process holds a session or its locks. deploy/systemd's units, docker-compose.yml and the bench set it to the process's name; under
# `make run` it defaults to honcho's (`web.1`, `webhook.1`, ...); empty: libpq's own (PGAPPNAME).
DATABASE_APPLICATION_NAME = envstr("DATABASE_APPLICATION_NAME", os.environ.get("HONCHO_PROCESS_NAME", ""))
if DATABASE_APPLICATION_NAME:
    DATABASES["default"]["OPTIONS"].setdefault("application_name", DATABASE_APPLICATION_NAME)
# A process whose threads spend most of their time waiting on something else (the lane workers: on
# Evolution, issue 26) shares a pool of this many connections among them instead of one per thread,
# and gives its connection back while it waits (pilot_status.database.release_while_waiting). 0 (the
# default, and what every other process runs with): Django's persistent connection per thread.
# pilot_status.lane_worker sets it for the threads pool (LANE_WORKER_DB_CONNECTIONS).
DATABASE_POOL_MAX_SIZE = envint("DATABASE_POOL_MAX_SIZE", 0, minimum=0)
if DATABASE_POOL_MAX_SIZE:
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django's pool and persistent connections exclude each other
    # A thread waits at most this long for a free connection (the send lease counts it: sending.budget).
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 1, "max_size": DATABASE_POOL_MAX_SIZE, "timeout": DB_POOL_WAIT_SECONDS,
    }
# The database the test suite creates and empties (each pytest-xdist worker appends its own suffix).
DATABASES["default"]["TEST"] = {"NAME": envstr("TEST_DATABASE_NAME", "test_pilot_status")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis: the cache, the rate limiters' buckets, the circuits, heartbeats and counters; never the truth.
REDIS_URL = envurl("REDIS_URL", ("redis", "rediss", "unix"))
# A process's threads share at most this many Redis connections; a thread waits up to REDIS_POOL_WAIT_SECONDS
# for a free one, then takes Redis for unavailable, as after a timeout. Without the wait, a burst of a lane
# worker's threads found every connection busy and fell back to per-process pacing while Redis was up.
REDIS_MAX_CONNECTIONS = envint("REDIS_MAX_CONNECTIONS", 32, minimum=1)
REDIS_POOL_WAIT_SECONDS = envfloat("REDIS_POOL_WAIT_SECONDS", 0.5, above=0, at_most=30)
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            # Redis is an accelerator here, never the truth: short timeouts, and callers
            # treat its errors as "no answer" (docs/architecture.md, principle 3).
            "SOCKET_CONNECT_TIMEOUT": 0.5,
            "SOCKET_TIMEOUT": 0.5,
            "IGNORE_EXCEPTIONS": False,
            "CONNECTION_POOL_CLASS": "redis.BlockingConnectionPool",
            "CONNECTION_POOL_KWARGS": {"max_connections": REDIS_MAX_CONNECTIONS, "timeout": REDIS_POOL_WAIT_SECONDS},
        },
    }
}

# RabbitMQ (or Redis) carrying the lane, maintenance and callbacks tasks.
CELERY_BROKER_URL = envurl("CELERY_BROKER_URL", ("amqp", "pyamqp", "redis"))
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# acks_late + prefetch 1: a worker killed mid-task leaves the task on the broker, and one
# slow send never holds a batch of others hostage (RTD settings/base.py).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_POOL_LIMIT = 10
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"

# Counters (pilot_status.metrics) wait in their process this long and go to Redis together; 0 sends
# each count at once.
METRICS_FLUSH_SECONDS = envfloat("METRICS_FLUSH_SECONDS", 1.0, minimum=0, at_most=60)

# Health (issue 24; pilot_status/health.py, pilot_status/heartbeats.py). Every long-running process writes
# a heartbeat this often; one older than HEARTBEAT_STALE_SECONDS is stale (status page, heartbeat_check);
# one older than HEARTBEAT_TTL_SECONDS expires, and the process leaves the status page.
HEARTBEAT_SECONDS = envfloat("HEARTBEAT_SECONDS", 5.0, above=0, at_most=300)
HEARTBEAT_STALE_SECONDS = envfloat("HEARTBEAT_STALE_SECONDS", 30.0, above=0)  # heartbeats.DEFAULT_STALE_SECONDS
HEARTBEAT_TTL_SECONDS = envint("HEARTBEAT_TTL_SECONDS", 24 * 3600, minimum=1)
if HEARTBEAT_STALE_SECONDS <= HEARTBEAT_SECONDS or HEARTBEAT_TTL_SECONDS <= HEARTBEAT_STALE_SECONDS:
    raise ImproperlyConfigured(
        "HEARTBEAT_SECONDS < HEARTBEAT_STALE_SECONDS < HEARTBEAT_TTL_SECONDS is required "
        f"(got {HEARTBEAT_SECONDS:g}, {HEARTBEAT_STALE_SECONDS:g}, {HEARTBEAT_TTL_SECONDS})"
    )
# /readyz: each check (Postgres, Redis, the broker) gets this long, all at once; a process answers from its
# last check while it is younger than READINESS_CACHE_SECONDS (pilot_status.health).
READINESS_TIMEOUT_SECONDS = envfloat("READINESS_TIMEOUT_SECONDS", 2.0, above=0, at_most=30)
READINESS_CACHE_SECONDS = envfloat("READINESS_CACHE_SECONDS", 1.0, minimum=0, at_most=10)

# Client API rate limit per key (docs/api.md).
RATE_LIMIT_PER_SECOND = envfloat("RATE_LIMIT_PER_SECOND", 50.0, above=0)
RATE_LIMIT_BURST = envint("RATE_LIMIT_BURST", 100, minimum=1)

# The overview's charts (dashboard.charts): each of their two queries is cancelled after this many ms, and
# the charts say they are unavailable instead of holding a web worker on a project's very busy day.
DASHBOARD_CHART_TIMEOUT_MS = envint("DASHBOARD_CHART_TIMEOUT_MS", 2000, minimum=1)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Only for `collectstatic` (e.g. a Docker image); without it WhiteNoise serves from the app folders.
STATIC_ROOT = envstr("STATIC_ROOT", "") or None
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Bodies above this are refused before parsing (S4: huge bodies get a clear 413).
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("MAX_REQUEST_BODY_BYTES", 64 * 1024, minimum=1024)

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["pilot_status.parsers.BoundedJSONParser"],  # jsonbody's bounds (issue 21)
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "EXCEPTION_HANDLER": "pilot_status.api.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Pilot Status API",
    "DESCRIPTION": "Send WhatsApp messages through Evolution API: delivered or visibly failed.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/v1",
    # failureReason appears on messages and dead letters: one enum in the schema, under one name.
    "ENUM_NAME_OVERRIDES": {
        "FailureReasonEnum": "messaging.api.schema.FAILURE_REASONS",
        "WebhookEventTypeEnum": "callbacks.models.EVENT_TYPES",
    },
    # /v1/docs/ loads Swagger UI from our own static files (drf-spectacular-sidecar), never a CDN:
    # the docs work offline and no third party's script runs on this origin.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# Celery's per-task lines (received, done, retried); see LOGGING below. Not a CELERY_ name: Celery reads those.
_task_log_level = envstr("CELERY_TASK_LOG_LEVEL", "WARNING")

# Plain lines on stderr; LOG_LEVEL is the root logger's level.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.request": {"level": "ERROR"},
        # Celery's line per task received, done or retried: at a lane's 100 sends a second, 200 lines a second
        # that say what each message's timeline already holds (a retry here is a task back in its queue for a
        # turn or a connection). A task that raises still logs (ERROR); CELERY_TASK_LOG_LEVEL=INFO brings every
        # line back.
        "celery.app.trace": {"level": _task_log_level},
        "celery.worker.strategy": {"level": _task_log_level},
    },
}
