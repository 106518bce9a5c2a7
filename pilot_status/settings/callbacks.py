"""Status callbacks: the endpoints tenants register and the deliveries and attempts made to them."""

from __future__ import annotations

from ..envparse import envbool, envfloat, envint, envports, envwaits


# Status callbacks (issue 23; docs/security.md "Callbacks", docs/internals.md "Path of a callback").
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
