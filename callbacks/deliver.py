"""The relay pass's second half and the delivery task's one job.

release_due: due deliveries of enabled endpoints whose circuit lets them through get a claim token
and a lease (`next_attempt_at` moves CALLBACKS_RELEASE_LEASE_SECONDS ahead) and are handed to the
`callbacks` queue after commit. A task that is lost leaves its delivery due again after the lease.

attempt: the task claims the delivery with its token (a duplicate task finds another token and does
nothing), asks the endpoint's circuit, takes a slot of its endpoint and its project (callbacks.inflight:
when either is full the delivery is held CALLBACKS_INFLIGHT_WAIT_SECONDS without using an attempt),
checks the URL's addresses again (DNS can change), signs, posts to the checked address within
CALLBACKS_ATTEMPT_SECONDS in all (callbacks.http) and records the attempt, the delivery's next step and the
endpoint's circuit in one transaction. Every attempt, refused ones too, leaves a DeliveryAttempt row.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from pilot_status import metrics

from . import addresses, http, inflight, signing
from .models import Circuit, Delivery, DeliveryAttempt, DeliveryStatus, WebhookEndpoint

log = logging.getLogger(__name__)

RELEASE_BATCH = 500
# Headers kept in the attempt log: the signature is kept too (it is no secret: it proves only this
# body), the secret never is.
USER_AGENT = "PilotStatus-Webhooks/1"

_RELEASE = """
    WITH due AS (
        SELECT d.id FROM callbacks_delivery d
        JOIN callbacks_webhookendpoint ep ON ep.id = d.endpoint_id
        WHERE d.status = 'PENDING' AND d.next_attempt_at <= clock_timestamp() AND ep.enabled
          AND (ep.circuit_state = 'closed' OR ep.circuit_retry_at IS NULL OR ep.circuit_retry_at <= clock_timestamp())
        ORDER BY d.next_attempt_at
        LIMIT %(batch)s
        FOR UPDATE OF d SKIP LOCKED
    )
    UPDATE callbacks_delivery d
    SET claim_token = gen_random_uuid(), next_attempt_at = clock_timestamp() + make_interval(secs => %(lease)s)
    FROM due WHERE d.id = due.id
    RETURNING d.id, d.claim_token
"""


def release_due(publish: Any) -> int:
    """Hand due deliveries to `publish(delivery_id, token)` once their leases are committed."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_RELEASE, {"batch": RELEASE_BATCH, "lease": settings.CALLBACKS_RELEASE_LEASE_SECONDS})
            released = cursor.fetchall()
    for delivery_id, token in released:
        publish(str(delivery_id), str(token))
    return len(released)


@dataclass(frozen=True)
class Outcome:
    done: str  # claimed_elsewhere | gone | endpoint_disabled | held | busy | succeeded | retry | failed


def attempt_lease_seconds() -> float:
    """How long a claim lasts: longer than any attempt can take (its lookup and its deadline)."""
    return settings.CALLBACKS_RESOLVE_SECONDS + settings.CALLBACKS_ATTEMPT_SECONDS + 60


def _claim(delivery_id: str, token: str) -> Delivery | None:
    lease = attempt_lease_seconds()
    mine = uuid.uuid4()
    now = timezone.now()
    claimed = Delivery.objects.filter(pk=delivery_id, claim_token=token, status=DeliveryStatus.PENDING).update(
        claim_token=mine, next_attempt_at=now + timedelta(seconds=lease)
    )
    if not claimed:
        return None
    return Delivery.objects.select_related("endpoint").get(pk=delivery_id)


def _hold(delivery: Delivery, until: datetime) -> None:
    """Back to due at `until`, no attempt used (an open circuit, a disabled endpoint)."""
    Delivery.objects.filter(pk=delivery.pk, claim_token=delivery.claim_token).update(claim_token=None, next_attempt_at=until)


def _may_pass(endpoint: WebhookEndpoint, now: datetime) -> datetime | None:
    """None if this attempt may go; else when to look again. Closed lets everything through; open
    lets one probe through after its wait (the one conditional UPDATE that wins) and holds the rest."""
    if endpoint.circuit_state == Circuit.CLOSED:
        return None
    retry_at = endpoint.circuit_retry_at or now
    if retry_at > now:
        return retry_at
    probe_until = now + timedelta(seconds=settings.CALLBACKS_CIRCUIT_OPEN_SECONDS)
    won = WebhookEndpoint.objects.filter(
        pk=endpoint.pk, circuit_state=endpoint.circuit_state, circuit_retry_at=endpoint.circuit_retry_at
    ).update(circuit_state=Circuit.HALF_OPEN, circuit_retry_at=probe_until)
    return None if won else probe_until


def body_of(delivery: Delivery) -> str:
    return json.dumps(delivery.payload, separators=(",", ":"), ensure_ascii=False)


def attempt(delivery_id: str, token: str) -> Outcome:
    delivery = _claim(delivery_id, token)
    if delivery is None:
        return Outcome("claimed_elsewhere")
    endpoint = delivery.endpoint
    now = timezone.now()
    if not endpoint.enabled:
        _hold(delivery, now)  # not released again while disabled; a re-enable goes on from here
        return Outcome("endpoint_disabled")
    wait = _may_pass(endpoint, now)
    if wait is not None:
        _hold(delivery, wait)
        return Outcome("held")
    slot = inflight.take(str(endpoint.pk), str(endpoint.project_id))
    if isinstance(slot, str):
        # The endpoint's or the project's attempts in flight are at their cap: this thread goes on to
        # other tenants' deliveries, and this one is due again in a moment, its attempts untouched.
        _hold(delivery, now + timedelta(seconds=settings.CALLBACKS_INFLIGHT_WAIT_SECONDS))
        metrics.incr(f"{metrics.PREFIX}callbacks:busy:{slot}")
        return Outcome("busy")
    try:
        return _attempt(delivery, endpoint, now)
    finally:
        inflight.give_back(slot)


def _attempt(delivery: Delivery, endpoint: WebhookEndpoint, now: datetime) -> Outcome:
    deadline = time.monotonic() + settings.CALLBACKS_ATTEMPT_SECONDS
    body = body_of(delivery)
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        **signing.headers(endpoint.secret, delivery.webhook_id, now, body),
    }
    try:
        target = addresses.check(delivery.url or endpoint.url, owner=str(endpoint.project_id))
    except addresses.Refused as refused:
        answer = http.Answer(None, "", 0, f"{refused.code}: {refused.message}"[:300], "")
    else:
        answer = http.post(target, body.encode(), headers, deadline)
    return _record(delivery, endpoint, now, headers, answer)


def _record(delivery: Delivery, endpoint: WebhookEndpoint, at: datetime, headers: dict[str, str], answer: http.Answer) -> Outcome:
    schedule = settings.CALLBACKS_RETRY_SCHEDULE
    finished = timezone.now()
    attempts = delivery.attempts + 1
    if answer.ok:
        changes: dict[str, Any] = {"status": DeliveryStatus.SUCCEEDED, "delivered_at": finished}
        outcome = "succeeded"
    elif attempts >= len(schedule):
        changes = {"status": DeliveryStatus.FAILED}
        outcome = "failed"
    else:
        changes = {"next_attempt_at": finished + timedelta(seconds=schedule[attempts])}
        outcome = "retry"
    with transaction.atomic():
        moved = Delivery.objects.filter(pk=delivery.pk, claim_token=delivery.claim_token).update(
            claim_token=None, attempts=attempts, last_attempt_at=at, **changes
        )
        if not moved:
            # Our claim's lease ran out and another task has it, or the endpoint (and the delivery
            # with it) was deleted meanwhile: the attempt is still logged if the delivery exists;
            # its state is the other task's to set.
            if not Delivery.objects.filter(pk=delivery.pk).exists():
                return Outcome("gone")
            outcome = "claimed_elsewhere"
        DeliveryAttempt.objects.create(
            delivery=delivery, attempted_at=at, url=delivery.url or endpoint.url, address=answer.address, request_headers=headers,
            response_status=answer.status, response_body=answer.body, duration_ms=answer.duration_ms,
            error=answer.error, succeeded=answer.ok,
        )
        _circuit_after(endpoint, answer.ok, finished)
    # ps:metrics:callbacks:{succeeded,retry,failed,claimed_elsewhere}: read with the other counters
    # (GET /api/internal/metrics); a FAILED delivery is also in the API and the dashboard.
    metrics.incr(f"{metrics.PREFIX}callbacks:{outcome}")
    if not answer.ok:
        log.info(
            "callback %s to endpoint %s failed (attempt %d): %s", delivery.webhook_id, endpoint.pk, attempts,
            answer.error or f"HTTP {answer.status}",
        )
    return Outcome(outcome)


def _circuit_after(endpoint: WebhookEndpoint, ok: bool, now: datetime) -> None:
    if ok:
        # One conditional UPDATE that finds nothing to do while the circuit is closed and clean: a row locked
        # and written on every success made each delivery wait for the previous one's commit, and the
        # deliveries being written for the endpoint wait at their foreign key check behind that lock.
        WebhookEndpoint.objects.filter(pk=endpoint.pk).exclude(
            circuit_state=Circuit.CLOSED, circuit_failures=0, circuit_retry_at__isnull=True, failing_since__isnull=True
        ).update(circuit_state=Circuit.CLOSED, circuit_failures=0, circuit_retry_at=None, failing_since=None,
                 updated_at=now)
        return
    # Locked: two attempts of one endpoint failing together must not both count from the same base. No key
    # update: the foreign key checks of new deliveries need not wait for it.
    current = WebhookEndpoint.objects.select_for_update(no_key=True).filter(pk=endpoint.pk).first()
    if current is None:
        return
    current.circuit_failures += 1
    current.failing_since = current.failing_since or now
    if current.circuit_state == Circuit.HALF_OPEN or current.circuit_failures >= settings.CALLBACKS_CIRCUIT_FAILURES:
        current.circuit_state = Circuit.OPEN
        current.circuit_retry_at = now + timedelta(seconds=settings.CALLBACKS_CIRCUIT_OPEN_SECONDS)
    fields = ["circuit_state", "circuit_failures", "circuit_retry_at", "failing_since", "updated_at"]
    if current.enabled and now - current.failing_since >= timedelta(seconds=settings.CALLBACKS_DISABLE_AFTER_SECONDS):
        current.enabled = False
        current.disabled_at = now
        current.disabled_reason = (
            f"Every attempt failed since {current.failing_since.isoformat()} "
            f"(CALLBACKS_DISABLE_AFTER_SECONDS={settings.CALLBACKS_DISABLE_AFTER_SECONDS:g})."
        )[:200]
        fields += ["enabled", "disabled_at", "disabled_reason"]
        log.warning("webhook endpoint %s disabled: %s", current.pk, current.disabled_reason)
    current.save(update_fields=fields)
