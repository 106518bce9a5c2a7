"""How long one claim of a message can take at worst, so that its lease can never run out mid-send.

Plain arithmetic on the settings (no Django import: pilot_status.settings uses it to refuse a lease
shorter than this at start-up). A claim does one of two things, never both under one lease
(sending.lost_answer renews the lease after a check):
- a **send**: connectionState (routing, when the cached state is stale), the send slot's sleep (at most SEND_SLOT_MAX_WAIT), then sendText (connect + read
  timeout + the typing delay Evolution waits before answering), then, in a threads-pool lane worker
  that gave its connection back for the call, the wait for a free one (at most DB_POOL_WAIT);
- a **check** of a lost answer (sending.evidence): findMessages by the message's own WhatsApp id, then, on an
  instance not known to honour that id, whatsappNumbers and findMessages for each form of the recipient's jid
  (at most CHECK_JIDS), each call at most connect + CHECK_READ_TIMEOUT.
"""

from __future__ import annotations

import math

# Read timeout of the short look-ups (connectionState, whatsappNumbers, findMessages, findStatusMessage).
CHECK_READ_TIMEOUT = 5.0
# The jids a recipient may be stored under: the one WhatsApp confirms, the digits one, its LID.
CHECK_JIDS = 3
# A send slot further away than this puts the message back instead of sleeping (sending.pacing).
SEND_SLOT_MAX_WAIT = 2.0
# How long a thread waits for a free connection of its process's pool (settings: DATABASE_POOL_MAX_SIZE).
DB_POOL_WAIT_SECONDS = 5.0
# Database round trips, Redis, a slow commit: what the arithmetic above does not count.
LEASE_MARGIN_SECONDS = 10.0


def send_seconds(connect: float, read: float, typing_max_ms: int) -> float:
    look_up = connect + CHECK_READ_TIMEOUT
    return (look_up + SEND_SLOT_MAX_WAIT + connect + read + typing_max_ms / 1000
            + DB_POOL_WAIT_SECONDS)


def check_seconds(connect: float) -> float:
    return (2 + CHECK_JIDS) * (connect + CHECK_READ_TIMEOUT)


def lease_seconds_needed(connect: float, read: float, typing_max_ms: int) -> int:
    """The shortest lease under which no claim can outlive its lease."""
    worst = max(send_seconds(connect, read, typing_max_ms), check_seconds(connect))
    return math.ceil(worst + LEASE_MARGIN_SECONDS)
