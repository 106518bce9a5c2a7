"""Settings, read from the environment only (README, "Set-up"; .env.example).

Every required value fails start-up loudly with the variable's name; there are no insecure
defaults here. `make run` and `make test` supply development values (scripts/env.sh). With DEBUG=0
(production mode) a weak or published secret or a `*` host stops every process in one line
(pilot_status/production.py), and the transport settings default to HTTPS-only.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from . import production
from .envparse import _raw, envbool, envfernetkeys, envfloat, envint, envpair, envports, envproxies, envsecret, envstr, envurl, envwaits
from messaging.sending.budget import DB_POOL_WAIT_SECONDS, lease_seconds_needed

BASE_DIR = Path(__file__).resolve().parent.parent


# 1 = development mode: relaxed hosts and transport defaults, development secrets accepted. 0 (the default) is
# production mode, which refuses weak or published secrets and a `*` host at start.
DEBUG = envbool("DEBUG", False)
if not DEBUG:
    # Production mode: no secret anyone could read in the repository, no `*` host (production.py).
    try:
        _refusal = production.refusal(_raw)
    except ImproperlyConfigured as exc:  # an unreadable NAME_FILE
        _refusal = str(exc)
    if _refusal:
        production.refuse(_refusal)
# Django's signing key (sessions, CSRF, password resets), and the source of the endpoint secrets' key
# when ENDPOINT_SECRET_KEYS is unset.
SECRET_KEY = envsecret("SECRET_KEY", min_length=production.SECRET_MIN_LENGTH)
# Development (DEBUG=1) may leave it unset and answer any host; production mode requires it.
ALLOWED_HOSTS = [h.strip() for h in envstr("ALLOWED_HOSTS", "*").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in envstr("CSRF_TRUSTED_ORIGINS", "http://127.0.0.1,http://localhost").split(",")
]
# Endpoint signing secrets are stored encrypted (callbacks.secret_storage) under these Fernet keys, newest
# first: the first encrypts, each decrypts (rotate_endpoint_secrets_key). Unset: one derived from SECRET_KEY.
ENDPOINT_SECRET_KEYS = envfernetkeys("ENDPOINT_SECRET_KEYS")

# Transport security (`manage.py check --deploy`): on by default in production mode, off under
# DEBUG=1. scripts/env.sh turns them off for `make run`, tests, bench and chaos, which serve plain
# HTTP on loopback; a deployment terminates TLS in front of gunicorn (docs/security.md).
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", not DEBUG)
# The consumer and the ingestion reconciler forward to INTERNAL_WEBHOOK_URL over the private network
# in plain HTTP, and the webhook pool (internal_wsgi) never redirects: the web pool, which also serves
# /api/internal/ in a one-process deployment, answers them the same way instead of a 301 to https.
# Prometheus's scrape (/metrics) too: it speaks plain HTTP on the private network, as the forwards do.
SECURE_REDIRECT_EXEMPT = [r"^api/internal/", r"^metrics$"]
# Cookies only over HTTPS, and HSTS (one year in production mode): the browser never speaks plain HTTP to
# the dashboard and admin once it has seen them over HTTPS.
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", not DEBUG)
# Only behind a proxy that sets this header itself and drops it from clients' requests: anyone
# else who can send it makes a plain-HTTP request look secure.
SECURE_PROXY_SSL_HEADER = envpair("SECURE_PROXY_SSL_HEADER")

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
    "axes",  # sign-in throttling for the dashboard and admin (see LOGIN_FAILURE_LIMIT below)
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

# The Evolution API server and its global API key (the `apikey` header of every call).
EVOLUTION_API_URL = envurl("EVOLUTION_API_URL", ("http", "https")).rstrip("/")
EVOLUTION_API_KEY = envstr("EVOLUTION_API_KEY")
# Evolution's RabbitMQ, where it publishes its events (the second ingestion channel beside the webhook);
# empty: webhook only. The exchange is Evolution's RABBITMQ_EXCHANGE_NAME.
EVOLUTION_RABBITMQ_URL = envstr("EVOLUTION_RABBITMQ_URL", "")
if EVOLUTION_RABBITMQ_URL:
    envurl("EVOLUTION_RABBITMQ_URL", ("amqp", "amqps"))
EVOLUTION_RABBITMQ_EXCHANGE = envstr("EVOLUTION_RABBITMQ_EXCHANGE", "evolution_exchange")
# Per-instance mode: Evolution publishes on an exchange named after each instance.
EVOLUTION_RABBITMQ_PER_INSTANCE = envbool("EVOLUTION_RABBITMQ_PER_INSTANCE", False)
# The consumer acks handled deliveries this many at a time (one `multiple` ack: a quorum queue settles
# each ack through its log), or once the oldest waited 0.1 s (ingestion.acks); 1 acks each delivery at
# once. At most the consumer's prefetch (100): a larger batch could never fill.
CONSUMER_ACK_BATCH = envint("CONSUMER_ACK_BATCH", 20, minimum=1)
if CONSUMER_ACK_BATCH > 100:
    raise ImproperlyConfigured(f"CONSUMER_ACK_BATCH must be at most 100 (the consumer's prefetch), got {CONSUMER_ACK_BATCH}")
# Each call to Evolution: connect and read timeouts, in seconds (the send lease counts on both).
EVOLUTION_CONNECT_TIMEOUT = envfloat("EVOLUTION_CONNECT_TIMEOUT", 3.0, above=0)
EVOLUTION_READ_TIMEOUT = envfloat("EVOLUTION_READ_TIMEOUT", 15.0, above=0)
# Human-like typing before each message (messaging.sending.typing_delay): ms per character
# of the text (UTILITY, MARKETING), a short fixed delay for an OTP, ± a jitter, and a cap that nothing
# passes (the send lease counts on it). 0 per character / for OTPs turns that part off; a message's
# own `typing: "off"` turns it off for that message.
TYPING_DELAY_MS_PER_CHAR = envint("TYPING_DELAY_MS_PER_CHAR", 30, minimum=0)
TYPING_DELAY_OTP_MS = envint("TYPING_DELAY_OTP_MS", 300, minimum=0)
TYPING_DELAY_JITTER = envfloat("TYPING_DELAY_JITTER", 0.2, minimum=0, at_most=1)
TYPING_DELAY_MAX_MS = envint("TYPING_DELAY_MAX_MS", 3000, minimum=0)

# The secret Evolution's webhook and our own forwards carry (X-Internal-Webhook-Secret), and the internal
# pages' credential.
INTERNAL_WEBHOOK_SECRET = envsecret(
    "INTERNAL_WEBHOOK_SECRET", min_length=16 if DEBUG else production.SECRET_MIN_LENGTH
)
# Where the RabbitMQ consumer and the ingestion reconciler forward events (docs/architecture.md, "Path of an event").
INTERNAL_WEBHOOK_URL = envurl(
    "INTERNAL_WEBHOOK_URL",
    ("http", "https"),
    f"http://127.0.0.1:{envint('PORT', 8000)}/api/internal/webhook",
)
PORT = envint("PORT", 8000, minimum=1)
# Our own forwards name this host; where it is the web pool (a one-process deployment), Django's
# host check would refuse them with 400 unless it is allowed. The webhook pool checks no host.
_INTERNAL_HOST = urlparse(INTERNAL_WEBHOOK_URL).hostname or ""
if ":" in _INTERNAL_HOST:
    _INTERNAL_HOST = f"[{_INTERNAL_HOST}]"
if _INTERNAL_HOST and "*" not in ALLOWED_HOSTS and _INTERNAL_HOST not in ALLOWED_HOSTS:
    ALLOWED_HOSTS.append(_INTERNAL_HOST)

# Sending policy (issue 4; docs/architecture.md, "Path of a message"). Named so that operators can find and tune them.
SEND_MAX_ATTEMPTS = envint("SEND_MAX_ATTEMPTS", 10, minimum=1)
RELAY_BATCH_SIZE = envint("RELAY_BATCH_SIZE", 200, minimum=1)
RELAY_POLL_SECONDS = envfloat("RELAY_POLL_SECONDS", 1.0, above=0)
# A release commits only once RabbitMQ has confirmed every task of it; a broker that has not within
# this many seconds (a memory or disk alarm blocks publishers) fails the pass, and its rows stay due.
RELAY_CONFIRM_TIMEOUT_SECONDS = envfloat("RELAY_CONFIRM_TIMEOUT_SECONDS", 10.0, above=0)
# Messages SENT/SERVER_ACK for longer than this without DELIVERY_ACK are checked with Evolution.
STATUS_SYNC_AFTER_SECONDS = envint("STATUS_SYNC_AFTER_SECONDS", 120, minimum=1)
# ...and no longer than this after the send: then status sync stops asking (a SYNC_STOPPED line).
STATUS_SYNC_GIVE_UP_AFTER_HOURS = envint("STATUS_SYNC_GIVE_UP_AFTER_HOURS", 72, minimum=1)
# A message SENT this long with no SERVER_ACK (or later receipt) is flagged unacknowledged by the status sync pass
# (messaging.unacknowledged): shown in the API and dashboard, a `message.unacknowledged` callback, asked about first.
ACK_TIMEOUT_SECONDS = envint("ACK_TIMEOUT_SECONDS", 600, minimum=1)
# Circuit breaker (issue 4 §5), one per instance and one for the whole gateway.
# Opens after this many transient failures in a row...
BREAKER_FAILURE_RUN = envint("BREAKER_FAILURE_RUN", 5, minimum=1)
# ...or when at least BREAKER_MIN_CALLS calls in BREAKER_WINDOW_SECONDS failed at this rate (0..1).
BREAKER_FAILURE_RATE = envfloat("BREAKER_FAILURE_RATE", 0.5, above=0, at_most=1)
BREAKER_MIN_CALLS = envint("BREAKER_MIN_CALLS", 20, minimum=1)
BREAKER_WINDOW_SECONDS = envint("BREAKER_WINDOW_SECONDS", 60, minimum=1)
# How long an open circuit holds releases before one probe may try (half-open).
BREAKER_OPEN_SECONDS = envfloat("BREAKER_OPEN_SECONDS", 30.0, above=0)
# The gateway-wide circuit needs this many distinct failing calls in a row (all instances together).
BREAKER_GATEWAY_FAILURE_RUN = envint("BREAKER_GATEWAY_FAILURE_RUN", 20, minimum=1)
# Pacing (issue 4 §6) of an `official` number (docs/sending-policy.md): sends per second per instance, and the
# burst allowed after a quiet spell. Meta's Cloud API takes 80 messages/s per business number by default. An
# instance's own `send_rate_per_second` (or its policy's `rate_per_second`) overrides the rate. Releases after an
# outage or a reconnect drain at this pace instead of all at once. An `unofficial` number has a human pace instead.
SEND_RATE_PER_INSTANCE = envfloat("SEND_RATE_PER_INSTANCE", 80.0, above=0)
# The sending policy (messaging.sending.policy, docs/sending-policy.md) runs this many of its seconds per real
# second: gaps, hourly and daily windows, warm-up days. Tests and chaos runs compress time with it (the
# simulator's `time_scale` has the same meaning); 1 in production.
SENDING_POLICY_TIME_SCALE = envfloat("SENDING_POLICY_TIME_SCALE", 1.0, above=0)
# The health governor per number (messaging.health, messaging.governor; docs/sending-policy.md "Health governor").
# Durations are policy seconds (SENDING_POLICY_TIME_SCALE). Disconnects ("Connection Closed", a connection that
# leaves open) and ERROR receipts on cold contacts are counted over this window.
HEALTH_WINDOW_SECONDS = envfloat("HEALTH_WINDOW_SECONDS", 3600.0, above=0)
# This many ERROR receipts (WhatsApp's 463, the reach-out time-lock) on sends to cold contacts inside the window
# stop the number's cold contacts for HEALTH_COOLING_SECONDS (a day: WhatsApp's time-lock lasts about that long).
HEALTH_COLD_ERRORS = envint("HEALTH_COLD_ERRORS", 1, minimum=1)
HEALTH_COOLING_SECONDS = envfloat("HEALTH_COOLING_SECONDS", 86400.0, above=0)
# At risk when at least this share of the day's sends (once there are HEALTH_MIN_SENDS) WhatsApp never
# acknowledged: a number WhatsApp throttles answers 201 and never acks (evolution-api #2597: 74 of 76).
HEALTH_UNACKNOWLEDGED_SHARE = envfloat("HEALTH_UNACKNOWLEDGED_SHARE", 0.2, above=0, at_most=1)
# At risk when opt-out replies reach this share of the day's sends (once there are HEALTH_MIN_SENDS): people who
# ask to stop are the ones who report a number.
HEALTH_OPT_OUT_SHARE = envfloat("HEALTH_OPT_OUT_SHARE", 0.05, above=0, at_most=1)
# The fewest sends in the number's day for a share to be judged (fewer say nothing about the number).
HEALTH_MIN_SENDS = envint("HEALTH_MIN_SENDS", 10, minimum=1)
# This many disconnects inside the window, or a logout, rest the number: it sends nothing until it is connected and
# HEALTH_REST_SECONDS passed without a disconnect (anti-ban guides rest a flagged number a day or two) ...
HEALTH_DISCONNECTS = envint("HEALTH_DISCONNECTS", 3, minimum=1)
HEALTH_REST_SECONDS = envfloat("HEALTH_REST_SECONDS", 86400.0, above=0)
# ... then it ramps back at risk (its caps cut) for this long before it is healthy again; any number at risk
# recovers only after this long with quiet signals.
HEALTH_RAMP_SECONDS = envfloat("HEALTH_RAMP_SECONDS", 3 * 86400.0, above=0)
# The share of its caps (hourly, daily, cold contacts) a number at risk may use.
HEALTH_AT_RISK_CAP_FACTOR = envfloat("HEALTH_AT_RISK_CAP_FACTOR", 0.5, above=0, at_most=1)
# Restricted (sends nothing until an operator lifts it): a logout that does not come back within this long, or
# HEALTH_LOGOUTS_TO_RESTRICT logouts inside HEALTH_LOGOUT_WINDOW_SECONDS; a close 403 (banned) at once.
HEALTH_LOGOUT_RESTRICT_SECONDS = envfloat("HEALTH_LOGOUT_RESTRICT_SECONDS", 3 * 86400.0, above=0)
HEALTH_LOGOUTS_TO_RESTRICT = envint("HEALTH_LOGOUTS_TO_RESTRICT", 3, minimum=1)
HEALTH_LOGOUT_WINDOW_SECONDS = envfloat("HEALTH_LOGOUT_WINDOW_SECONDS", 7 * 86400.0, above=0)
# An operator's health state (admin) holds this long before the governor judges the signals again.
HEALTH_OVERRIDE_SECONDS = envfloat("HEALTH_OVERRIDE_SECONDS", 86400.0, above=0)
# Real seconds between the governor's passes (beat): the ends of rests, ramps and cooling periods, the shares.
HEALTH_PASS_SECONDS = envint("HEALTH_PASS_SECONDS", 30, minimum=1)
SEND_RATE_BURST = envint("SEND_RATE_BURST", 10, minimum=1)
# Fair release (issue 4 §7): the relay keeps at most this many ready tasks in each lane's queue,
# and releases them round-robin by project, so a blast cannot bury another project's messages.
RELAY_LANE_DEPTH = envint("RELAY_LANE_DEPTH", 100, minimum=1)
# The OTP lane's own depth: an OTP released behind another tenant's bulk of OTPs waits for the ready tasks
# ahead of it, so its queue is kept shallow (its worker's threads hold what is being sent; the relay refills
# on every accept's NOTIFY, or 0.1 s after a pass that held rows back). Bench B2o: another tenant's OTP p99
# beside project A's 667 bulk OTPs.
RELAY_LANE_DEPTH_OTP = envint("RELAY_LANE_DEPTH_OTP", 16, minimum=1)
# A claim's lease must outlive the claim's worst case (messaging.sending.budget: timeouts, typing delay,
# send slot), or a second worker could take a message that is still being sent (issue 22):
# by default it is that worst case plus a margin (at least 60 s), and a shorter SEND_LEASE_SECONDS is
# refused at start-up.
SEND_LEASE_SECONDS_NEEDED = lease_seconds_needed(
    EVOLUTION_CONNECT_TIMEOUT, EVOLUTION_READ_TIMEOUT, TYPING_DELAY_MAX_MS
)
# How long a claim holds a message before another worker may take it (at least one send attempt's worst case).
SEND_LEASE_SECONDS = envint("SEND_LEASE_SECONDS", max(60, SEND_LEASE_SECONDS_NEEDED), minimum=5)
if SEND_LEASE_SECONDS < SEND_LEASE_SECONDS_NEEDED:
    raise ImproperlyConfigured(
        f"SEND_LEASE_SECONDS={SEND_LEASE_SECONDS} is shorter than one send attempt can take "
        f"({SEND_LEASE_SECONDS_NEEDED} s with EVOLUTION_CONNECT_TIMEOUT, EVOLUTION_READ_TIMEOUT and TYPING_DELAY_MAX_MS "
        "as set): a second worker could claim a message still being sent"
    )
# After a lost answer, a record Evolution stamped this many seconds outside the attempt still counts
# as possibly the attempt's (the two clocks may differ; Evolution stamps whole seconds).
UNCONFIRMED_CLOCK_SKEW_SECONDS = envfloat("UNCONFIRMED_CLOCK_SKEW_SECONDS", 2.0, minimum=0, at_most=60)
# How long after its deliverUntil a message whose last answer was lost may still be checked with
# Evolution before the reconciler fails it OUTCOME_UNKNOWN (the lane worker normally decides first).
UNCONFIRMED_GRACE_SECONDS = envint("UNCONFIRMED_GRACE_SECONDS", 600, minimum=0)
# How long an attempt's answer may take after its read timeout passed before we ask Evolution about it.
UNCONFIRMED_SETTLE_SECONDS = envfloat("UNCONFIRMED_SETTLE_SECONDS", 5.0, minimum=0, at_most=300)
# How long an instance's connectionState answer is trusted (smart wait, issue 4 §3).
INSTANCE_STATE_CACHE_SECONDS = envfloat("INSTANCE_STATE_CACHE_SECONDS", 3.0)

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
# The status page (/api/internal/status) answers `Authorization: Bearer <OPS_STATUS_TOKEN>` when set
# (a credential that reads the page and nothing else), and the internal secret always.
OPS_STATUS_TOKEN = envstr("OPS_STATUS_TOKEN", "")
if OPS_STATUS_TOKEN and not DEBUG:
    _problem = production.secret_problem("OPS_STATUS_TOKEN", OPS_STATUS_TOKEN)
    if _problem:
        production.refuse(_problem)
# GET /metrics (pilot_status.scrape) answers `Authorization: Bearer <METRICS_TOKEN>` only: a credential that
# reads the metrics and nothing else. Production mode requires it (pilot_status.production); unset with
# DEBUG=1, the endpoint refuses everyone. Each scrape-time reader (outbox, queues, circuits, heartbeats,
# counters) gets METRICS_SCRAPE_TIMEOUT_SECONDS, all at once; a late one is left out of that scrape.
METRICS_TOKEN = envstr("METRICS_TOKEN", "")
METRICS_SCRAPE_TIMEOUT_SECONDS = envfloat("METRICS_SCRAPE_TIMEOUT_SECONDS", 1.0, above=0, at_most=10)

# Client API rate limit per key (docs/api.md).
RATE_LIMIT_PER_SECOND = envfloat("RATE_LIMIT_PER_SECOND", 50.0, above=0)
RATE_LIMIT_BURST = envint("RATE_LIMIT_BURST", 100, minimum=1)
# Evolution's webhooks per authenticated instance (issue 21): past it they are shed with 429 and
# Retry-After, which Evolution retries. Far above real traffic (one number's receipts are a few
# per message sent) and above what the bench pushes through one instance (B5: about 600/s); it
# stops a runaway or hostile sender, not load. Our own forwards are never limited.
WEBHOOK_RATE_PER_INSTANCE = envfloat("WEBHOOK_RATE_PER_INSTANCE", 1000.0, above=0)
WEBHOOK_RATE_BURST = envint("WEBHOOK_RATE_BURST", 2000, minimum=1)

# Every path that sets a password (admin, create_member, createsuperuser, changepassword) checks these.
AUTH_PASSWORD_VALIDATORS = [{"NAME": f"django.contrib.auth.password_validation.{name}"} for name in (
    "UserAttributeSimilarityValidator", "MinimumLengthValidator", "CommonPasswordValidator", "NumericPasswordValidator")]
# Sign-in throttling (django-axes; dashboard.lockout), dashboard and admin alike: LOGIN_FAILURE_LIMIT wrong
# passwords for a username from one client, or LOGIN_USERNAME_FAILURE_LIMIT from all together, refuse it (429)
# for LOGIN_LOCKOUT_SECONDS, right password or not; a good sign-in resets the count. The client: REMOTE_ADDR, or
# the X-Forwarded-For hop TRUSTED_PROXIES (a count, or networks) vouch for; IPv6 by its /64 (client_address).
LOGIN_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", 5, minimum=1)
LOGIN_USERNAME_FAILURE_LIMIT = envint("LOGIN_USERNAME_FAILURE_LIMIT", 100, minimum=LOGIN_FAILURE_LIMIT)
LOGIN_LOCKOUT_SECONDS = envint("LOGIN_LOCKOUT_SECONDS", 15 * 60, minimum=1)
TRUSTED_PROXY_COUNT, TRUSTED_PROXY_NETWORKS = envproxies("TRUSTED_PROXIES")
# Axes first: it refuses a locked-out pair before any password check.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(seconds=LOGIN_LOCKOUT_SECONDS)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "username"]  # this order: dashboard.lockout reads it
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "dashboard.lockout.locked_out"
AXES_USERNAME_CALLABLE = "dashboard.lockout.username_of"
AXES_CLIENT_IP_CALLABLE = "dashboard.lockout.address_of"
AXES_HANDLER = "dashboard.lockout.StorableAttempts"
AXES_DISABLE_ACCESS_LOG = True  # no row per successful sign-in; failures are what the lockout counts
AXES_VERBOSE = False
# The overview's charts (dashboard.charts): each of their two queries is cancelled after this many ms, and
# the charts say they are unavailable instead of holding a web worker on a project's very busy day.
DASHBOARD_CHART_TIMEOUT_MS = envint("DASHBOARD_CHART_TIMEOUT_MS", 2000, minimum=1)
LOGIN_URL = "/dashboard/login/"
LOGIN_REDIRECT_URL = "/dashboard/"
LOGOUT_REDIRECT_URL = "/dashboard/login/"

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

# Dual ingestion (issue 5). Our RabbitMQ queues are named <prefix>.ingest / .retry.<n>s / .parked;
# in per-instance mode the consumer re-reads the instance list this often to bind new exchanges.
EVOLUTION_RABBITMQ_QUEUE_PREFIX = envstr("EVOLUTION_RABBITMQ_QUEUE_PREFIX", "pilot_status.evolution")
EVOLUTION_RABBITMQ_REFRESH_SECONDS = envint("EVOLUTION_RABBITMQ_REFRESH_SECONDS", 30, minimum=1)
# Ingestion reconciler: period of its beat entry, and how old an unprocessed event must be.
INGESTION_RECONCILE_SECONDS = envint("INGESTION_RECONCILE_SECONDS", 300, minimum=1)
INGESTION_STALE_AFTER_SECONDS = envint("INGESTION_STALE_AFTER_SECONDS", 120, minimum=0)
# An unprocessed event forwarded this many times without being taken is given up: the reconciler marks it
# processed with outcome `dead` (its last_error kept; visible in the admin's inbox), and retention prunes it.
INGESTION_MAX_FORWARDS = envint("INGESTION_MAX_FORWARDS", 10, minimum=1)
# The size bound of one Evolution event, on the webhook and on RabbitMQ alike (ingestion.sizes), apart from
# the client API's MAX_REQUEST_BODY_BYTES: a media message's caption and thumbnail, or a messages.set history
# batch, outgrow 64 KiB. Over it, the webhook answers 413 and the consumer parks the message; neither stores it.
EVOLUTION_EVENT_MAX_BYTES = envint("EVOLUTION_EVENT_MAX_BYTES", 4 * 1024 * 1024, minimum=64 * 1024)

# Maintenance (issue 22). Beat periods (pilot_status/celery.py reads the same variables; checked here).
RECONCILE_SECONDS = envfloat("RECONCILE_SECONDS", 10.0, above=0)
STATUS_SYNC_SECONDS = envfloat("STATUS_SYNC_SECONDS", 60.0, above=0)
INSTANCE_POLL_SECONDS = envfloat("INSTANCE_POLL_SECONDS", 15.0, above=0)
RETENTION_SECONDS = envfloat("RETENTION_SECONDS", 600.0, above=0)
# Time budget of one pass (checked between messages or batches): a slow Evolution or a big backlog
# ends the pass early, the next tick goes on. Celery's soft time limit backs each one up.
RECONCILE_PASS_SECONDS = envfloat("RECONCILE_PASS_SECONDS", 8.0, above=0)
STATUS_SYNC_PASS_SECONDS = envfloat("STATUS_SYNC_PASS_SECONDS", 40.0, above=0)
RETENTION_PASS_SECONDS = envfloat("RETENTION_PASS_SECONDS", 30.0, above=0)
# Retention: processed inbox rows (raw payloads, inbound customer messages) and the timeline lines
# of finished messages are deleted after this many days, 1,000 rows per statement.
INBOX_RETENTION_DAYS = envint("INBOX_RETENTION_DAYS", 30, minimum=1)
TIMELINE_RETENTION_DAYS = envint("TIMELINE_RETENTION_DAYS", 90, minimum=1)

# Status callbacks (issue 23; docs/security.md "Callbacks", docs/architecture.md "Path of a callback").
# Beat period of the relay pass that writes deliveries from the timeline, the inbox and the opt-ins
# and hands the due ones to the `callbacks` queue (pilot_status/celery.py reads the same variable).
CALLBACKS_RELAY_SECONDS = envfloat("CALLBACKS_RELAY_SECONDS", 1.0, above=0)
# Waits before each attempt, in seconds: Svix's schedule (immediately, 5 s, 5 min, 30 min, 2 h, 5 h,
# 10 h, 10 h: about 27.6 h). After the last one fails the delivery is FAILED (replayable).
CALLBACKS_RETRY_SCHEDULE = envwaits("CALLBACKS_RETRY_SCHEDULE", "0,5,300,1800,7200,18000,36000,36000")
# An endpoint that has failed without a single success for this long is disabled (Svix: 5 days).
CALLBACKS_DISABLE_AFTER_SECONDS = envfloat("CALLBACKS_DISABLE_AFTER_SECONDS", 5 * 24 * 3600.0, above=0)
# The circuit per endpoint: opens after this many failed attempts in a row; one probe after the wait.
CALLBACKS_CIRCUIT_FAILURES = envint("CALLBACKS_CIRCUIT_FAILURES", 5, minimum=1)
CALLBACKS_CIRCUIT_OPEN_SECONDS = envfloat("CALLBACKS_CIRCUIT_OPEN_SECONDS", 60.0, above=0)
# One attempt: connect and whole-answer timeouts (Svix waits 15 s), and what is kept of the answer.
CALLBACKS_CONNECT_TIMEOUT_SECONDS = envfloat("CALLBACKS_CONNECT_TIMEOUT_SECONDS", 5.0, above=0, at_most=30)
CALLBACKS_TIMEOUT_SECONDS = envfloat("CALLBACKS_TIMEOUT_SECONDS", 15.0, above=0, at_most=60)
CALLBACKS_RESPONSE_BODY_BYTES = envint("CALLBACKS_RESPONSE_BODY_BYTES", 1024, minimum=0)
# One attempt's whole exchange (connect, send, the answer) ends within this many seconds however the receiver
# drips its bytes, or it is a failed attempt (callbacks.http's watchdog; Celery's threads pool ignores time limits).
CALLBACKS_ATTEMPT_SECONDS = envfloat("CALLBACKS_ATTEMPT_SECONDS", 15.0, above=0, at_most=60)
# Attempts in flight at once, across every callbacks worker, per endpoint and per project (callbacks.inflight):
# one tenant's slow receivers hold at most this many delivery threads. A delivery over the cap waits this long
# without using an attempt.
CALLBACKS_INFLIGHT_PER_ENDPOINT = envint("CALLBACKS_INFLIGHT_PER_ENDPOINT", 4, minimum=1)
CALLBACKS_INFLIGHT_PER_PROJECT = envint("CALLBACKS_INFLIGHT_PER_PROJECT", 4, minimum=1)
CALLBACKS_INFLIGHT_WAIT_SECONDS = envfloat("CALLBACKS_INFLIGHT_WAIT_SECONDS", 1.0, above=0, at_most=60)
# A delivery handed to Celery and never claimed (a lost task) is due again after this long.
CALLBACKS_RELEASE_LEASE_SECONDS = envfloat("CALLBACKS_RELEASE_LEASE_SECONDS", 120.0, above=0)
# Finished deliveries (SUCCEEDED, FAILED) and their attempts are deleted after this many days.
CALLBACKS_RETENTION_DAYS = envint("CALLBACKS_RETENTION_DAYS", 30, minimum=1)
# Bounds of the API: endpoints per project, URL length.
CALLBACKS_MAX_ENDPOINTS_PER_PROJECT = envint("CALLBACKS_MAX_ENDPOINTS_PER_PROJECT", 20, minimum=1)
CALLBACKS_MAX_URL_LENGTH = envint("CALLBACKS_MAX_URL_LENGTH", 2048, minimum=16)
# Refuse endpoints whose host resolves to a loopback, private, link-local, multicast, reserved or
# metadata address, at registration, at a send's accept and before every attempt. True only for
# development (DEBUG=1) and the test stacks: production mode refuses it (pilot_status.production).
CALLBACKS_ALLOW_PRIVATE_ADDRESSES = envbool("CALLBACKS_ALLOW_PRIVATE_ADDRESSES", False)
# Looking up an endpoint's or a callbackUrl's host (registration, accept, every attempt) gets this long; a
# project whose lookup overran is refused at once until it ends, and every project once this many lookups of
# one process have (callbacks.addresses).
CALLBACKS_RESOLVE_SECONDS = envfloat("CALLBACKS_RESOLVE_SECONDS", 2.0, above=0, at_most=10)
CALLBACKS_RESOLVE_OVERDUE_MAX = envint("CALLBACKS_RESOLVE_OVERDUE_MAX", 8, minimum=1)
# Callbacks go to ports 80 and 443, and to these (comma-separated, e.g. "8443"): docs/security.md.
CALLBACKS_EXTRA_PORTS = envports("CALLBACKS_EXTRA_PORTS")
# Replays (one delivery, or an endpoint's failed ones) per endpoint and minute, across every web process.
CALLBACKS_REPLAYS_PER_MINUTE = envint("CALLBACKS_REPLAYS_PER_MINUTE", 10, minimum=1)
