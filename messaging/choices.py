"""The messaging domain's fixed vocabularies: categories, statuses, failure reasons, timeline kinds. The models
(messaging.models) store them; everything else imports them from there or from here. How a status may change is
messaging.lifecycle's."""

from __future__ import annotations

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


class FailureReason(models.TextChoices):
    INSTANCE_NOT_FOUND = "INSTANCE_NOT_FOUND", "Instance not found on Evolution"
    INVALID_RECIPIENT = "INVALID_RECIPIENT", "Number is not on WhatsApp"
    RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED", "Retries exhausted"
    EXPIRED = "EXPIRED", "deliverUntil passed before a send succeeded"
    REJECTED = "REJECTED", "Rejected by WhatsApp"
    # An answer was lost and Evolution's records could not show whether that send went out.
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN", "May have been delivered: the outcome of a send is unknown"
    # The sending policy (docs/sending-policy.md): no instance of the project knew the recipient or had cold
    # contacts left before deliverUntil.
    NO_WARM_INSTANCE = "NO_WARM_INSTANCE", "No instance could reach this cold contact in time"
    # The recipient's consent ended before it was sent (an opt-out keyword, a revocation): never sent, and
    # resent only once a new opt-in is recorded (messaging.consent).
    OPTED_OUT = "OPTED_OUT", "The recipient opted out before it was sent"


class ConnectionState(models.TextChoices):
    OPEN = "open", "open"
    CONNECTING = "connecting", "connecting"
    CLOSE = "close", "close"


class SendProfile(models.TextChoices):
    """How a number is paced (messaging.sending.policy, docs/sending-policy.md)."""

    UNOFFICIAL = "unofficial", "Unofficial (Baileys): human pace"
    OFFICIAL = "official", "Official (Cloud API): Meta's throughput and pair rate"


class HealthState(models.TextChoices):
    """A number's standing with WhatsApp as the product judges it; `resting` holds its sends."""

    HEALTHY = "healthy", "healthy"
    AT_RISK = "at_risk", "at risk"
    RESTING = "resting", "resting"
    RESTRICTED = "restricted", "restricted"


class SignalKind(models.TextChoices):
    """What the health governor counts for a number (messaging.governor)."""

    COLD_SEND = "cold_send", "a send to a cold contact"
    COLD_ERROR = "cold_error", "an ERROR receipt (463) on a message to a cold contact"
    DISCONNECT = "disconnect", "the connection left open, or a send met Connection Closed"
    LOGOUT = "logout", "the connection closed logged out (401)"
    OPT_OUT = "opt_out", "an opt-out reply to the number"


class WaitingReason(models.TextChoices):
    """Why the sending policy holds a message (a WAITING line's `why`, the API's `waitingReason`)."""

    PACING = "pacing", "the number's gap between sends"
    HOURLY_CAP = "hourly_cap", "the number's hourly cap"
    DAILY_CAP = "daily_cap", "the number's daily cap"
    WARMING_UP = "warming_up", "the number's warm-up ramp"
    RESTING = "resting", "the number is resting"
    # The health governor (messaging.governor): an operator lifts a restriction; a cooling period after a 463 on a
    # cold contact holds only the sends to cold contacts.
    RESTRICTED = "restricted", "the number is restricted"
    COOLING = "cooling", "the number writes to no cold contact for now"


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
    # SENT for ACK_TIMEOUT_SECONDS and WhatsApp never acknowledged it (no SERVER_ACK): flagged, status kept.
    UNACKNOWLEDGED = "UNACKNOWLEDGED", "Sent, never acknowledged by WhatsApp"


# The timeline lines that are a change of status a customer sees: each owes a `message.status`
# callback (callbacks.derive). SENDING is ours (a claim), so it has no line of its own; QUEUED comes
# back with a force resend (RESENT).
STATUS_LINE_KINDS: tuple[str, ...] = (EventKind.STATUS, EventKind.FAILED, EventKind.RESENT)


class DeadLetterStatus(models.TextChoices):
    OPEN = "OPEN", "Open"
    RESENT = "RESENT", "Resent"
    DISMISSED = "DISMISSED", "Dismissed"
