# Pilot Status — set-up, run and test (GNU make, Debian/Ubuntu, as root).
#
#   make run     install what is missing, start Postgres/Redis/RabbitMQ on loopback, migrate,
#                seed the demo project, then run the whole stack under honcho (Ctrl-C stops it;
#                the services keep running until `make stop`)
#   make test    the whole test suite against real services;  make test ARGS="-k foo -x"
#
# Configuration (contract §7): recipes run through scripts/env.sh, where a non-empty value in
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
DEV_LOCK := requirements/dev.lock
LOCK_ARGS ?=
# No index or find-links lines in the locks (they name this machine's mirrors), and the header says `make lock`.
PIP_COMPILE := CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
	--strip-extras --no-emit-index-url --no-emit-find-links --no-emit-trusted-host

.PHONY: lint help install system-deps services migrate run test bench chaos stop status browser-deps bench-deps lock

help:
	@echo "make run           install, start services, migrate, seed the demo, run the stack (honcho)"
	@echo "make test          run the test suite (ARGS=\"...\" for pytest)"
	@echo "make install       apt packages + .venv from requirements/dev.lock (pip only when the lock changed)"
	@echo "make lock          re-pin requirements/*.lock after editing requirements.txt or requirements/*.in"
	@echo "make services      start Postgres :55432, Redis :56379, RabbitMQ :56720 (loopback)"
	@echo "make migrate       apply migrations"
	@echo "make bench / chaos python -m bench / python -m chaos"
	@echo "make status / stop services status / stop them (by PID)"
	@echo "make browser-deps  install Debian's chromium (browser tests)"

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
# lock are kept; LOCK_ARGS="--upgrade-package NAME" (or --upgrade) moves them. pip and setuptools are
# pinned too (--allow-unsafe): pip-tools needs them, and --require-hashes refuses anything unpinned.
lock: $(STAMP)
	$(PIP_COMPILE) $(LOCK_ARGS) --output-file requirements/runtime.lock requirements.txt
	$(PIP_COMPILE) $(LOCK_ARGS) --output-file requirements/simulator.lock requirements/simulator.in
	$(PIP_COMPILE) $(LOCK_ARGS) --output-file $(DEV_LOCK) requirements/dev.in

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

# Tests: Redis db 1, RabbitMQ vhost pilot_test (scripts/env.sh --test), and PG_FAST=1 —
# synchronous_commit=off, fsync stays on — unless PG_FAST is set. PG_FAST is also exported to
# pytest so that a fault test restarting Postgres through scripts/services.sh keeps it.
test: install browser-deps lint
	PG_FAST=$${PG_FAST:-1} $(SERVICES) up
	PG_FAST=$${PG_FAST:-1} $(TEST_ENV) $(VENV)/bin/pytest $(ARGS)

# mypy --strict on the product and the simulator (mypy.ini); tests, bench and chaos are excluded.
lint: install
	$(TEST_ENV) $(VENV)/bin/mypy messaging ingestion pilot_status dashboard simulator callbacks

# Benchmarks run with the normal durability settings (`up` without PG_FAST restores them).
bench: migrate bench-deps
	$(ENV) $(VENV)/bin/python -m bench $(ARGS)

chaos: migrate
	$(ENV) $(VENV)/bin/python -m chaos $(ARGS)
