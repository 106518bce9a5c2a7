# Pilot Status — set-up, run and test (GNU make, Debian/Ubuntu, as root).
#
#   make run     install what is missing, start Postgres/Redis/RabbitMQ on loopback, migrate,
#                seed the demo project, then run the whole stack under honcho (Ctrl-C stops it;
#                the services keep running until `make stop`)
#   make test    the whole test suite against real services;  make test ARGS="-k foo -x"
#   make test-fast  the tests that start no stack process and are not `slow`, for the edit-test loop
#
# Configuration (README, "Set-up"): recipes run through scripts/env.sh, where a non-empty value in
# the environment (or on make's command line) wins over .env, which wins over the defaults
# written in scripts/env.sh. The defaults deliberately do not live here: a make default would
# reach the recipes as an environment value and hide .env.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.requirements.stamp
SERVICES := scripts/services.sh
ENV := scripts/env.sh
TEST_ENV := scripts/env.sh --test
ARGS ?=
# pytest-xdist workers for `make test` and `make test-fast`: one per core of the 2-core CI host
# (docs/operations.md "Test suite").
TEST_WORKERS ?= 2
DEV_LOCK := requirements/dev.lock
LOCK_ARGS ?=
# Universal locks (uv pip compile --universal): one lock for every Python from 3.11 on, each requirement kept
# with its marker (redis's async-timeout below 3.11.3, ...), so the lock compiled here installs on Debian 12's
# 3.11.2 and Debian 13's 3.13 alike (tests/pilot_status/test_lock_closure.py). uv reads no pip configuration
# and the locks name no index (uv writes one only when asked), so no machine's mirror lands in them.
# --system-certs: the platform's certificate store, as pip uses it (a TLS-inspecting proxy's authority).
UV_COMPILE := $(VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--no-strip-markers --system-certs --custom-compile-command "make lock"

.PHONY: lint help install system-deps services migrate run test test-fast bench bench-check chaos chaos-check stop \
	status browser-deps bench-deps lock fresh-check image image-check api-docs settings-docs

help:
	@echo "make run           install, start services, migrate, seed the demo, run the stack (honcho)"
	@echo "make test          run the test suite (ARGS=\"...\" for pytest)"
	@echo "make test-fast     the tests that start no stack process and are not slow (the edit-test loop; ARGS too)"
	@echo "make api-docs      regenerate docs/api.md (the API reference) from the OpenAPI schema"
	@echo "make settings-docs regenerate docs/settings.md (every setting) from the settings' code"
	@echo "make install       apt packages + .venv from requirements/dev.lock (pip only when the lock changed)"
	@echo "make lock          re-pin requirements/*.lock after editing requirements.txt or requirements/*.in"
	@echo "make services      start Postgres :55432, Redis :56379, RabbitMQ :56720 (loopback)"
	@echo "make migrate       apply migrations"
	@echo "make bench / chaos the harness's own tests (bench-check / chaos-check), then python -m bench / chaos"
	@echo "make status / stop services status / stop them (by PID)"
	@echo "make browser-deps  install Debian's chromium (browser tests)"
	@echo "make image         build the production image (docker, else buildah; IMAGE=, BASE_IMAGE=)"
	@echo "make image-check   build it, then tests/image: its packages, user, health check, and a message through it"
	@echo "make fresh-check   make test and make run in new minimal Debian 12 and 13 roots (FRESH_SUITES=...; long)"

# --- installation ------------------------------------------------------------------------------

install: system-deps $(STAMP)

system-deps:
	@$(SERVICES) install

# Debian's own python3 needs python3-venv for `-m venv`; pyenv/python.org builds have it.
$(VENV)/bin/python:
	@command -v $(PYTHON) >/dev/null || $(SERVICES) apt-ensure python3 python3-venv
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "Python >= 3.11 needed, $(PYTHON) is $$($(PYTHON) -V 2>&1)" >&2; exit 1; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || $(SERVICES) apt-ensure python3-venv
	$(PYTHON) -m venv $(VENV)

# pip runs only when the lock is newer than the stamp (or the venv is new). requirements/dev.lock pins
# every package, indirect ones included, with their hashes: pip refuses a file whose hash differs and a
# package the lock does not name (requirements/README.md).
$(STAMP): $(DEV_LOCK) | $(VENV)/bin/python
	$(VENV)/bin/pip install --disable-pip-version-check --no-input -q --require-hashes -r $(DEV_LOCK)
	@touch $@

# Re-pins the locks from requirements.txt (runtime), requirements/simulator.in and requirements/dev.in,
# in that order: each constrains the next, so a package has one version in all three. Pins already in a
# lock are kept; LOCK_ARGS="--upgrade-package NAME" (or --upgrade) moves them.
lock: $(STAMP)
	$(UV_COMPILE) $(LOCK_ARGS) --output-file requirements/runtime.lock requirements.txt
	$(UV_COMPILE) $(LOCK_ARGS) --output-file requirements/simulator.lock requirements/simulator.in
	$(UV_COMPILE) $(LOCK_ARGS) --output-file $(DEV_LOCK) requirements/dev.in

browser-deps:
	@command -v chromium >/dev/null || $(SERVICES) apt-ensure chromium

# wrk is the load generator issue 7 names; without it B1 falls back to Python threads, which share
# the two cores with the stack and add their own GIL waits to every latency they measure. Where it
# cannot be installed (no apt, not root) the bench still runs, and its report names the fallback.
bench-deps:
	@command -v wrk >/dev/null || $(SERVICES) apt-ensure wrk \
		|| echo "make bench: wrk could not be installed; B1 and B5 measure with Python threads (see the report's Load line)" >&2

# --- services ----------------------------------------------------------------------------------

services:
	@$(SERVICES) up

stop:
	@$(SERVICES) down

status:
	@$(SERVICES) status

# --- application -------------------------------------------------------------------------------

migrate: install services
	$(ENV) $(VENV)/bin/python manage.py migrate --noinput

# seed_demo creates the demo project once, writes .state/simulator-instances.json (the
# simulator's --preload) and prints the keys and a curl line. It refuses production mode
# (DEBUG=0, scripts/env.sh's default too) unless told this is a demo. honcho gets `-e /dev/null`:
# its own .env loading would override values set in the environment.
run: migrate
	$(ENV) $(VENV)/bin/python manage.py seed_demo --i-know-this-is-a-demo
	$(ENV) scripts/procfile.sh > .state/Procfile
	rm -rf .state/prometheus  # the last run's histogram files (PROMETHEUS_MULTIPROC_DIR's default)
	exec $(ENV) $(VENV)/bin/honcho start -e /dev/null -f .state/Procfile

# Tests (scripts/test.sh): a parallel phase on TEST_WORKERS pytest-xdist workers, each with its own database,
# Redis db, RabbitMQ vhost, logs and ports (tests/support/workers.py), then the `serial` tests (they really stop
# a shared server) alone. scripts/env.sh --test: Redis db 1 and vhost pilot_test, which each worker shifts to
# its own. PG_FAST=1 — synchronous_commit=off, fsync stays on — unless PG_FAST is set; it is also exported to
# pytest so that a fault test restarting Postgres through scripts/services.sh keeps it.
test: install browser-deps lint
	PG_FAST=$${PG_FAST:-1} $(SERVICES) up
	PG_FAST=$${PG_FAST:-1} TEST_WORKERS=$(TEST_WORKERS) $(TEST_ENV) scripts/test.sh $(ARGS)

# The edit-test loop: every test that starts no stack process (web, relay, workers, simulator: pytest.ini's
# `stack` marker), both phases as above; no lint and no browser install. `make test` runs them all.
test-fast: install
	PG_FAST=$${PG_FAST:-1} $(SERVICES) up
	PG_FAST=$${PG_FAST:-1} TEST_WORKERS=$(TEST_WORKERS) $(TEST_ENV) scripts/test.sh -m "not stack and not slow" $(ARGS)

# docs/api.md from the OpenAPI schema (tests/pilot_status/test_api_reference.py fails while it is out of date).
api-docs: install
	$(TEST_ENV) $(VENV)/bin/python manage.py api_reference

settings-docs: install
	$(TEST_ENV) $(VENV)/bin/python manage.py settings_reference

# mypy --strict on the product and the simulator (mypy.ini); tests, bench and chaos are excluded.
lint: install
	$(TEST_ENV) $(VENV)/bin/mypy messaging ingestion pilot_status dashboard simulator callbacks

# The harnesses' own tests (pytest.ini's `harness` marker): each runs its harness end to end at smoke sizes
# and checks what it wrote, a few minutes each. `make bench` and `make chaos` run them first, so that a long
# run starts only from a harness that works; `make test` leaves them out (docs/operations.md "Test suite").
bench-check: install services
	$(TEST_ENV) $(VENV)/bin/pytest -m harness tests/bench

chaos-check: install services
	$(TEST_ENV) $(VENV)/bin/pytest -m harness tests/chaos

# Benchmarks run with the normal durability settings (`up` without PG_FAST restores them).
bench: migrate bench-deps bench-check
	$(ENV) $(VENV)/bin/python -m bench $(ARGS)

chaos: migrate chaos-check
	$(ENV) $(VENV)/bin/python -m chaos $(ARGS)

# The README's promise on machines nobody prepared (not part of `make test`: it takes the better part of an hour
# per suite): a new debootstrap --variant=minbase root per Debian suite, this checkout's HEAD cloned in, then
# `make test` and `make run` inside it. Outcome and times: docs/operations.md.
FRESH_SUITES ?= bookworm trixie
fresh-check:
	scripts/fresh-check.sh $(FRESH_SUITES)

# The production image (Dockerfile): docker where a daemon answers, else buildah --isolation chroot; without a
# reachable registry the base is made from Debian's packages (scripts/image.sh says how; README "Docker image").
IMAGE ?= pilot-status:local
image:
	IMAGE=$(IMAGE) scripts/image.sh build

# tests/image (left out of `make test`, which never builds an image): the built image's Python packages against
# requirements/runtime.lock, its user, HEALTHCHECK and static files, and web, webhook, relay and a lane worker
# run from it against this checkout's services, a message going accept -> SENT -> READ. Record: docs/operations.md.
# Same services, settings and test database as `make test`.
image-check: image install
	PG_FAST=$${PG_FAST:-1} $(SERVICES) up
	PILOT_STATUS_IMAGE=$(IMAGE) IMAGE_TOOL=$$(scripts/image.sh tool) PG_FAST=$${PG_FAST:-1} \
		$(TEST_ENV) $(VENV)/bin/pytest tests/image $(ARGS)
