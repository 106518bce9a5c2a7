"""Security: production mode's refusals, the secrets, hosts and transport security, the proxies a client's address
is read through, sign-in throttling, and the credentials of the status page and the metrics.

The package imports this module first (pilot_status/settings/__init__.py), so that with DEBUG=0 a weak or
published secret, a `*` host or private callbacks stop every process before any other setting is read. The
rules themselves live in pilot_status/production.py (standard library only); this module applies them.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured

from .. import production
from ..envparse import _raw, envbool, envfernetkeys, envfloat, envint, envpair, envproxies, envsecret, envstr


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

# The secret Evolution's webhook and our own forwards carry (X-Internal-Webhook-Secret), and the internal
# pages' credential.
INTERNAL_WEBHOOK_SECRET = envsecret(
    "INTERNAL_WEBHOOK_SECRET", min_length=16 if DEBUG else production.SECRET_MIN_LENGTH
)

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
LOGIN_URL = "/dashboard/login/"
LOGIN_REDIRECT_URL = "/dashboard/"
LOGOUT_REDIRECT_URL = "/dashboard/login/"
