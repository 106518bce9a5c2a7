# Pilot Status's image (issue 24): one image for every process (web, webhook, workers, beat, relays,
# consumer); docker-compose.yml picks the command. Configuration comes only from the environment
# (README, "Set-up" and "Docker image"); nothing secret is baked in.
#
# Stages:
#   builder    downloads every package of requirements/runtime.lock (and simulator.lock), checking each
#              file against the lock's hashes, and turns them into wheels;
#   simulator  the Evolution API simulator alone (docker-compose's demo profile: `target: simulator`);
#   runtime    the default: the runtime wheels and the product's code only — no tests/, bench/, chaos/,
#              docs/, scripts/, no development tool (pytest, playwright, mypy...; requirements/dev.in),
#              no simulator, no compiler, no pip cache. Static files are collected at build, and every
#              process runs as the unprivileged user `app`.
# Size: README, "Docker image" (`make image` builds it and prints the size).
# Build: `make image` (scripts/image.sh): docker where a daemon answers (BuildKit, the builder of `docker build`
# and compose since Docker 23: `RUN --mount`), else buildah (`--isolation chroot --format docker`, so that the
# HEALTHCHECK is kept).
#
# The base is a build argument: any Debian-based image with Python 3.11 or later and its venv module. The
# default is python:3.11-slim from a registry; where no registry is reachable, scripts/image.sh makes one from
# Debian's packages (mmdebstrap: python3, python3-venv, ca-certificates, netbase, tzdata; then `podman import`)
# and builds with BASE_IMAGE=localhost/pilot-status-base:bookworm. The locks are universal, so either Python
# installs the same pins. Every stage installs into the virtual environment /opt/venv (first on PATH), never
# into the system's Python: Debian's refuses pip (PEP 668), and python:3.11-slim's keeps its own pip apart.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
# The same uid in every stage: the `state` volume (/app/.state) is shared by the app and the simulator.
RUN useradd --system --uid 10001 --home-dir /app app \
    && python3 -m venv /opt/venv
WORKDIR /app


FROM base AS builder
COPY requirements/runtime.lock requirements/simulator.lock /locks/
# --require-hashes: a file whose hash is not in the lock, or a package the lock does not pin, stops the
# build. Every runtime package ships wheels for this Python; one that did not would be built here, in
# the builder only (add build-essential to this stage then).
# The secret pip_cert (scripts/image.sh passes the host's PIP_CERT bundle when it has one: a network that
# inspects TLS signs PyPI's certificates with its own authority) is mounted for this command only; no layer
# and no later stage keeps it.
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && pip wheel --require-hashes --wheel-dir /wheels/runtime -r /locks/runtime.lock \
    && pip wheel --require-hashes --wheel-dir /wheels/simulator -r /locks/simulator.lock


# The Evolution API simulator for the demo profile: a stand-in for an outside system, never part of a
# deployment, so it gets its own small image rather than a place in the product's.
FROM base AS simulator
RUN --mount=type=bind,from=builder,source=/wheels/simulator,target=/wheels \
    pip install --no-index --no-deps /wheels/*.whl
COPY simulator simulator
RUN mkdir -p /app/.state && chown app:app /app/.state
USER app
EXPOSE 8081
HEALTHCHECK --interval=10s --timeout=6s --start-period=10s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/', timeout=5)"
CMD ["python", "-m", "simulator", "--host", "0.0.0.0", "--port", "8081"]


FROM base AS runtime

ENV DJANGO_SETTINGS_MODULE=pilot_status.settings \
    STATIC_ROOT=/app/staticfiles \
    PORT=8000

# The wheels come in through a bind mount, so no layer keeps them; --no-deps: the lock already names
# every dependency, and the builder checked each file's hash. pip (and the setuptools of 3.11's venv) go
# afterwards: the venv then holds exactly the runtime lock's packages (make image-check lists them).
RUN --mount=type=bind,from=builder,source=/wheels/runtime,target=/wheels \
    pip install --no-index --no-deps /wheels/*.whl \
    && pip uninstall --yes --quiet pip setuptools

# The product's code only (tests/pilot_status/test_image.py checks this list).
COPY manage.py gunicorn.conf.py ./
COPY pilot_status pilot_status
COPY messaging messaging
COPY ingestion ingestion
COPY dashboard dashboard
COPY callbacks callbacks

# Static files (admin, Swagger UI from drf-spectacular-sidecar, the dashboard's assets) into STATIC_ROOT,
# served by WhiteNoise. Settings need these variables to load; the values exist only for this command
# (DEBUG=1 so that production mode's secret checks do not apply to a throwaway key) and no process
# ever runs with them: compose and every deployment supply their own.
RUN DEBUG=1 SECRET_KEY=insecure-collectstatic-at-build-time-only-never-used-by-a-process \
    INTERNAL_WEBHOOK_SECRET=insecure-collectstatic-at-build-time-only-never-used-by-a-process \
    DATABASE_URL=postgres://build@127.0.0.1:5432/build REDIS_URL=redis://127.0.0.1:6379/0 \
    CELERY_BROKER_URL=amqp://build@127.0.0.1:5672/build \
    EVOLUTION_API_URL=http://127.0.0.1:8081 EVOLUTION_API_KEY=build \
    python manage.py collectstatic --noinput \
    && mkdir -p /app/.state \
    && chown app:app /app/.state
USER app

EXPOSE 8000
# Liveness: /healthz answers while the process serves requests, without looking at Postgres, Redis or
# the broker (pilot_status/health.py), through pilot_status.probe (the image has no curl). This is the
# default for `docker run`; docker-compose.yml gives each service its own check (web and webhook:
# /readyz; the other processes: their heartbeat), with the same interval, timeout and retries here.
HEALTHCHECK --interval=10s --timeout=6s --start-period=30s --retries=3 \
    CMD python -m pilot_status.probe "http://127.0.0.1:${PORT}/healthz"
CMD ["sh", "-c", "exec gunicorn pilot_status.wsgi:application -b 0.0.0.0:${PORT} -w ${WEB_CONCURRENCY:-$(nproc)} --timeout 30 --graceful-timeout 20 --keep-alive 5 --access-logfile -"]
