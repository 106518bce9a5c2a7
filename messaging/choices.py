"""The messaging domain's fixed vocabularies: categories, statuses and their order, failure reasons, timeline
kinds. The models (messaging.models) store them; everything else imports them from there or from here."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models


class Environment(models.TextChoices):
    TEST = "TEST", "Test"
    LIVE = "LIVE", "Live"


class Category(models.TextChoices):
    OTP = "OTP", "OTP"
    UTILITY = "UTILITY", "Utility"
    MARKETING = "MARKETING", "Marketing"


class Priority(models.TextChoices):
    NORMAL = "normal", "Normal"
    URGENT = "urgent", "Urgent"


class Typing(models.TextChoices):
    """Whether the send shows "typing…" first (Evolution's `delay`; messaging.sending.typing_delay)."""

    AUTO = "auto", "Human-like typing delay"
    OFF = "off", "No typing delay"


class Status(models.TextChoices):
    QUEUED = "QUEUED", "Queued"
    SENDING = "SENDING", "Sending"
    SENT = "SENT", "Sent"
    SERVER_ACK = "SERVER_ACK", "Server ack"
    DELIVERED = "DELIVERED", "Delivered"
    READ = "READ", "Read"
    FAILED = "FAILED", "Failed"


# Delivery progress only moves right. FAILED is terminal except through a force resend.
PROGRESS = [Status.SENT, Status.SERVER_ACK, Status.DELIVERED, Status.READ]


STAMPS = {
    Status.SENT: "sent_at",
    Status.SERVER_ACK: "server_ack_at",
    Status.DELIVERED: "delivered_at",
    Status.READ: "read_at",
}


def progress_move(status: str, at: datetime, **detail: Any) -> tuple[list[str], dict[str, Any], list[Any]]:
    """What a receipt moving a message forward to `status` writes, for a compare-and-set: the
    statuses it may move from, the column changes and its timeline line."""
    from .writes import KeepEarlier, TimelineLine

    stamp = STAMPS[Status(status)]
    # A receipt that overtakes an earlier one (DELIVERY_ACK before SERVER_ACK, common when the
    # two channels race) implies the earlier steps: fill their times if they are still empty.
    implied = {STAMPS[earlier]: KeepEarlier(at) for earlier in PROGRESS[1 : PROGRESS.index(Status(status))]}
    changes = {"status": status, "updated_at": at, **implied, stamp: at}
    return statuses_before(status), changes, [TimelineLine(EventKind.STATUS, {"status": status, **detail}, at)]


def statuses_before(status: str) -> list[str]:
    """Statuses from which `status` is a forward move (used by compare-and-set updates)."""
    order = [Status.QUEUED, Status.SENDING, *PROGRESS]
    return [s.value for s in order[: order.index(Status(status))]]


class FailureReason(models.TextChoices):
    INSTANCE_NOT_FOUND = "INSTANCE_NOT_FOUND", "Instance not found on Evolution"
    INVALID_RECIPIENT = "INVALID_RECIPIENT", "Number is not on WhatsApp"
    RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED", "Retries exhausted"
    EXPIRED = "EXPIRED", "deliverUntil passed before a send succeeded"
    REJECTED = "REJECTED", "Rejected by WhatsApp"
    # An answer was lost and Evolution's records could not show whether that send went out.
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN", "May have been delivered: the outcome of a send is unknown"


class ConnectionState(models.TextChoices):
    OPEN = "open", "open"
    CONNECTING = "connecting", "connecting"
    CLOSE = "close", "close"


class EventKind(models.TextChoices):
    ACCEPTED = "ACCEPTED", "Accepted"
    DISPATCHED = "DISPATCHED", "Released to its lane"
    ATTEMPT = "ATTEMPT", "Send attempt"
    WAITING = "WAITING", "Waiting (no attempt used)"
    REROUTED = "REROUTED", "Re-routed to another instance"
    STATUS = "STATUS", "Status change"
    FAILED = "FAILED", "Failed"
    DEAD_LETTERED = "DEAD_LETTERED", "Dead-lettered"
    RESENT = "RESENT", "Force resend"
    DISMISSED = "DISMISSED", "Dismissed"
    RECOVERED = "RECOVERED", "Recovered by a reconciler"
    # Status sync asked Evolution for STATUS_SYNC_GIVE_UP_AFTER_HOURS and never heard of a receipt:
    # it stops asking. The message keeps its status (SENT or SERVER_ACK).
    SYNC_STOPPED = "SYNC_STOPPED", "Status checks stopped"
    CHECKED = "CHECKED", "Lost answer checked with Evolution"


# The timeline lines that are a change of status a customer sees: each owes a `message.status`
# callback (callbacks.derive). SENDING is ours (a claim), so it has no line of its own; QUEUED comes
# back with a force resend (RESENT).
STATUS_LINE_KINDS: tuple[str, ...] = (EventKind.STATUS, EventKind.FAILED, EventKind.RESENT)


class DeadLetterStatus(models.TextChoices):
    OPEN = "OPEN", "Open"
    RESENT = "RESENT", "Resent"
    DISMISSED = "DISMISSED", "Dismissed"
