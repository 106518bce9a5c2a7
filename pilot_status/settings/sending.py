"""Sending: the Evolution API client, the typing delay, the relay and the lanes, the sending policy and its
circuits and pacing, the health governor, the send lease, and the maintenance passes over sent messages."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from ..envparse import envfloat, envint, envstr, envurl
from messaging.sending.budget import lease_seconds_needed


# The Evolution API server and its global API key (the `apikey` header of every call).
EVOLUTION_API_URL = envurl("EVOLUTION_API_URL", ("http", "https")).rstrip("/")
EVOLUTION_API_KEY = envstr("EVOLUTION_API_KEY")

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

# Sending policy (issue 4; docs/internals.md, "Path of a message"). Named so that operators can find and tune them.
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

# Maintenance (issue 22). Beat periods (pilot_status/celery.py reads the same variables; checked here).
RECONCILE_SECONDS = envfloat("RECONCILE_SECONDS", 10.0, above=0)
STATUS_SYNC_SECONDS = envfloat("STATUS_SYNC_SECONDS", 60.0, above=0)
INSTANCE_POLL_SECONDS = envfloat("INSTANCE_POLL_SECONDS", 15.0, above=0)
# Time budget of one pass (checked between messages or batches): a slow Evolution or a big backlog
# ends the pass early, the next tick goes on. Celery's soft time limit backs each one up.
RECONCILE_PASS_SECONDS = envfloat("RECONCILE_PASS_SECONDS", 8.0, above=0)
STATUS_SYNC_PASS_SECONDS = envfloat("STATUS_SYNC_PASS_SECONDS", 40.0, above=0)
