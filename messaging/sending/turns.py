"""The worker's side of an unofficial number's sending policy (docs/sending-policy.md): its one send in flight.

The relay reserved the number for this message (messaging.sending.human_pace); the claim confirms the reservation
for the length of its lease (`take`), asks the policy again now that it knows the recipient (a cold contact counts
against the number's daily quota), and then sends: typing, then the text, inside that one slot. `end` counts the
send, draws the jittered gap to the number's next send and frees the number, whatever the answer was. A message the
policy holds goes back to QUEUED with a WAITING line naming the limit, or fails EXPIRED when its number may not send
before its deliverUntil.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.utils import timezone

from pilot_status import metrics

from .. import governor, lifecycle
from ..choices import WaitingReason
from ..models import EventKind, FailureReason, Instance, Message, SendProfile
from . import human_pace, policy, slots


@dataclass(frozen=True)
class Turn:
    instance_id: int
    values: dict[str, float]
    schedule: policy.Schedule
    cold: bool
    scale: float


def is_human(instance: Instance) -> bool:
    return instance.send_profile == SendProfile.UNOFFICIAL


def take(message: Message, token: uuid.UUID, instance: Instance) -> Turn | str:
    """This message's turn on its number, or what was done instead: "held" (back to QUEUED) or "expired"."""
    now = timezone.now()
    assert message.lease_expires_at is not None
    values = policy.values_for(SendProfile.UNOFFICIAL, instance.send_policy)
    scale = slots.scale()
    begun = slots.begin(instance.pk, message.pk, now, message.lease_expires_at, to=message.to)
    unreachable = False  # held by the cold-contact quota alone
    if begun is None:  # another send holds the number
        verdict = policy.Verdict(now + policy.real(values["gap_min_seconds"], scale), WaitingReason.PACING)
    else:
        schedule = begun.schedule
        assert begun.cold is not None
        cold = begun.cold
        health = governor.policy_terms(begun.health_state, begun.cold_paused_until)
        verdict = policy.decide(values, schedule, now, scale, cold=cold, **health)
        if verdict.now:
            if cold:
                # An ERROR receipt (463) on this send counts against the number's health (messaging.governor).
                governor.cold_send(instance.pk, message.pk)
            return Turn(instance.pk, values, schedule, cold, scale)
        slots.release(instance.pk, message.pk)
        unreachable = cold and policy.decide(values, schedule, now, scale, cold=False, **health).now
    assert verdict.until is not None
    metrics.messages(f"held:{verdict.reason}:{message.lane}")
    if verdict.until >= message.deliver_until and unreachable:
        # The sticky sender found no number that knows the recipient or may still write to a stranger.
        lifecycle.fail(message, FailureReason.NO_WARM_INSTANCE,
                       human_pace.no_warm_detail(message.to, verdict.reason, instance.name, verdict.until),
                       lease_token=token)
        return "failed"
    if verdict.until >= message.deliver_until:
        lifecycle.fail(message, FailureReason.EXPIRED, human_pace.expired_detail(verdict.reason, verdict.until),
                       lease_token=token)
        return "expired"
    lifecycle.requeue(message, token, verdict.until, EventKind.WAITING,
                      detail={"why": verdict.reason, "instance": instance.name})
    return "held"


def end(turn: Turn, message: Message, sent: bool) -> None:
    """The call is over: the send counted, the next one a jittered gap away, the number free; a sent message's
    recipient is no longer a cold contact of this number."""
    now = timezone.now()
    slots.finish(turn.instance_id, message.pk, policy.after_send(turn.values, turn.schedule, now, turn.scale,
                                                                 cold=turn.cold),
                 sent_to=message.to if sent else None, at=now)
