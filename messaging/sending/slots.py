"""An unofficial number's schedule in Postgres (SendSchedule): its one send in flight, and what it sent lately.

The decisions are messaging.sending.policy's; this module reads and writes the row they judge, always by
compare-and-set, so any number of relays and workers share one truth (docs/architecture.md, principles 2 and 3):
- the relay reserves a number for the one message it releases (`reserve`); a number already reserved, or not due
  yet, gets nothing released, so its other messages wait in the outbox;
- the worker confirms the reservation for its claim (`begin`), sends, and ends it (`finish`): the send is counted
  and the next send drawn a jittered gap later. A held or re-routed message gives the reservation back (`release`);
- a lost task or a dead worker holds the number at most until `reserved_until` (the worker's lease).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

from .. import exchanges
from ..models import SendSchedule
from ..prepared import prepared_cursor
from . import policy

_ENSURE = """
INSERT INTO messaging_sendschedule (instance_id, hour_sent, day_sent, day_cold, cold_sent_at)
SELECT unnest(%(ids)s::bigint[]), 0, 0, 0, '{}' ON CONFLICT (instance_id) DO NOTHING
"""
_COLUMNS = ("next_send_at", "first_send_at", "hour_started_at", "hour_sent", "day_started_at", "day_sent", "day_cold",
            "cold_sent_at")


@dataclass(frozen=True)
class Standing:
    """A number as the relay sees it: its schedule, and whether a send holds it now."""

    schedule: policy.Schedule
    in_flight: bool


def scale() -> float:
    return float(settings.SENDING_POLICY_TIME_SCALE)


def _schedule(row: Any) -> policy.Schedule:
    values = dict(zip(_COLUMNS, row))
    return policy.Schedule(**{**values, "cold_sent_at": tuple(values["cold_sent_at"] or ())})


def standings(instance_ids: list[int], now: datetime) -> dict[int, Standing]:
    """The schedules of these numbers (made when missing)."""
    with connection.cursor() as cursor:
        cursor.execute(_ENSURE, {"ids": instance_ids})
        cursor.execute(
            f"SELECT instance_id, reserved_until > %(now)s, {', '.join(_COLUMNS)} FROM messaging_sendschedule"
            " WHERE instance_id = ANY(%(ids)s)", {"ids": instance_ids, "now": now})
        return {row[0]: Standing(_schedule(row[2:]), bool(row[1])) for row in cursor.fetchall()}


# A number is free when no send holds it (or the one that did ran out of time) and it is due. The bulk lanes leave
# a number with a due OTP to the OTP relay: an OTP takes the number's next slot ahead of everything else.
_RESERVE = """
UPDATE messaging_sendschedule s SET reserved_by = v.message_id, reserved_until = %(until)s
  FROM unnest(%(ids)s::bigint[], %(messages)s::uuid[]) AS v(instance_id, message_id)
 WHERE s.instance_id = v.instance_id
   AND (s.reserved_until IS NULL OR s.reserved_until <= %(now)s)
   AND (s.next_send_at IS NULL OR s.next_send_at <= %(now)s)
   AND (%(otp)s OR NOT EXISTS (
        SELECT 1 FROM messaging_outboxentry o JOIN messaging_message m ON m.id = o.message_id
         WHERE o.lane = 'otp' AND o.available_at <= %(now)s AND m.instance_id = s.instance_id))
RETURNING s.instance_id
"""


def reserve(chosen: dict[int, str], now: datetime, until: datetime, otp: bool) -> set[int]:
    """Reserve each number {instance: message} for its message until `until`; the numbers reserved."""
    if not chosen:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_RESERVE, {"ids": list(chosen), "messages": list(chosen.values()), "now": now,
                                  "until": until, "otp": otp})
        return {row[0] for row in cursor.fetchall()}


# A send's turn is taken (`begin`) and ended (`finish`) once per unofficial message: both are prepared statements
# (messaging.prepared), as the claim and the answer's are.
# The number's health is read in the same statement: the instance was read before the claim, and the governor may have
# moved it since (messaging.governor). So is whether the recipient is a cold contact of the number, when asked: the
# policy needs it whenever the turn is taken, and a statement of its own would be one more round trip per send.
_BEGIN = """
UPDATE messaging_sendschedule s SET reserved_by = %(message)s, reserved_until = %(until)s
  FROM messaging_instance i
 WHERE s.instance_id = %(instance)s AND i.id = s.instance_id
   AND (s.reserved_by = %(message)s OR s.reserved_until IS NULL OR s.reserved_until <= %(now)s)
RETURNING {columns}, i.health_state, i.cold_paused_until, {cold}
"""
_BEGIN_COLUMNS = ", ".join(f"s.{name}" for name in _COLUMNS)
_BEGIN_COLD = _BEGIN.format(columns=_BEGIN_COLUMNS, cold=exchanges.COLD.format(instance="s.instance_id"))
_BEGIN_ONLY = _BEGIN.format(columns=_BEGIN_COLUMNS, cold="NULL")


@dataclass(frozen=True)
class Begun:
    """The number's schedule as this send holds it, the number's health as it stands now, and whether the recipient
    is a cold contact of the number (exchanges.COLD; None when not asked)."""

    schedule: policy.Schedule
    health_state: str
    cold_paused_until: datetime | None
    cold: bool | None = None


def begin(instance_id: int, message_id: uuid.UUID, now: datetime, until: datetime, to: str | None = None) -> Begun | None:
    """The worker's claim on the number's one send: held by this message (or free) until `until`, the lease, with
    whether the recipient `to` (when given) is a cold contact of the number. None: another send holds it."""
    params: dict[str, Any] = {"message": message_id, "until": until, "instance": instance_id, "now": now}
    statement = _BEGIN_ONLY
    if to is not None:
        params.update(exchanges.cold_params(to))
        statement = _BEGIN_COLD
    with prepared_cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    if row is None and not SendSchedule.objects.filter(instance_id=instance_id).exists():
        # A number no relay has reserved yet (the sticky sender's choice): its schedule is made, then held.
        with connection.cursor() as cursor:
            cursor.execute(_ENSURE, {"ids": [instance_id]})
        with prepared_cursor() as cursor:
            cursor.execute(statement, params)
            row = cursor.fetchone()
    if row is None:
        return None
    n = len(_COLUMNS)
    return Begun(_schedule(row[:n]), row[n], row[n + 1], row[n + 2])


_FINISH = "UPDATE messaging_sendschedule SET {sets}, reserved_by = NULL, reserved_until = NULL" \
          " WHERE instance_id = %(instance)s AND reserved_by = %(message)s".format(
              sets=", ".join(f"{name} = %({name})s" for name in _COLUMNS))
# A send's exchange with its recipient is written in the same statement (one round trip less per send), whether or not
# the number was still this message's: the send went out either way.
_FINISH_SENT = f"WITH {exchanges.SENT_CTE}, finished AS ({_FINISH} RETURNING 1) SELECT count(*) FROM finished"


def finish(instance_id: int, message_id: uuid.UUID, after: policy.Schedule, sent_to: str | None = None,
           at: datetime | None = None) -> bool:
    """The send is over: counted, the next one due a jittered gap later, the number free, and with `sent_to`, the
    number's exchange with that recipient at `at` (exchanges.SENT_CTE). False when this message no longer held the number
    (its lease ran out and another send took it): nothing written to its schedule."""
    values: dict[str, Any] = {name: getattr(after, name) for name in _COLUMNS}
    values["cold_sent_at"] = list(after.cold_sent_at)
    params = {**values, "instance": instance_id, "message": message_id}
    with prepared_cursor() as cursor:
        if sent_to is None:
            cursor.execute(_FINISH, params)
            return bool(cursor.rowcount)
        assert at is not None
        cursor.execute(_FINISH_SENT, {**params, **exchanges.sent_params(instance_id, sent_to, at)})
        return bool(cursor.fetchone()[0])


_RELEASE = "UPDATE messaging_sendschedule SET reserved_by = NULL, reserved_until = NULL" \
           " WHERE instance_id = %(instance)s AND reserved_by = %(message)s"


def release(instance_id: int, message_id: uuid.UUID) -> None:
    """Give the number back without a send (the message was held or re-routed)."""
    with prepared_cursor() as cursor:
        cursor.execute(_RELEASE, {"instance": instance_id, "message": message_id})
