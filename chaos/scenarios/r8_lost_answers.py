"""R8: answers lost on the way back, after Evolution sent the message or before it did. Every message
that ends SENT or later reached WhatsApp exactly once (counted at the simulator, which logs every
sendText and whether it reached WhatsApp); every other one is FAILED with a reason that says what is
known: OUTCOME_UNKNOWN (it may have been delivered) or a reason that says it was not sent, and then
it never reached WhatsApp."""

from __future__ import annotations

from typing import Any

from ..context import ACKS_DELIVERED, Context

FAULT = "every fifth sendText answer lost after WhatsApp got the message, every fifth other one lost before"
MUST = "each message SENT or later reached WhatsApp exactly once; every other one is FAILED saying what is known"
PROGRESSED = ("SENT", "SERVER_ACK", "DELIVERED", "READ")
# Reasons that say the message was not sent: it must never have reached WhatsApp.
NOT_SENT = ("EXPIRED", "RETRIES_EXHAUSTED", "INSTANCE_NOT_FOUND", "INVALID_RECIPIENT")
LOST_AFTER, LOST_BEFORE = 0.2, 0.8 * 0.2  # one draw per call: a fifth, then a fifth of the rest
HANG_S = 6.0  # longer than the stack's EVOLUTION_READ_TIMEOUT: the caller gives up, the answer is lost
# A message whose answer is lost before the send on every try waits out the backoff between its tries
# (messaging.sending.backoff: 5 s, 15 s, 45 s, 2¼ min, each up to 20 % longer). With 40 messages, one drew four
# in a row in three smoke runs of nine on 2026-12-02, and stayed QUEUED, rightly, past a 120-s drain. The drain covers
# RETRIES_COVERED retries, so that the row judges what the product did, not a drain shorter than its backoff; it
# ends as soon as every message is final.
RETRIES_COVERED = 4


def backoff_covered_s() -> float:
    from messaging.sending import backoff

    waits = sum(backoff.unjittered_delay_for(attempt) * (1 + backoff.JITTER) for attempt in range(1, RETRIES_COVERED + 1))
    return waits + (RETRIES_COVERED + 1) * HANG_S + 30.0


def run(ctx: Context) -> dict[str, Any]:
    from messaging.models import Message

    s = ctx.sizes
    ctx.fresh(ACKS_DELIVERED)
    for instance in ctx.world.a.fleet:
        ctx.sim.faults(instance.name, lose_answer_after_rate=LOST_AFTER, lose_answer_before_rate=LOST_BEFORE,
                       hang_ms=int(HANG_S * 1000))
    sent = ctx.send_many(s.r8_messages, "r8")
    answers: dict[str, int] = {}
    for x in sent:
        key = str(x.status or (x.body.get("exception") if isinstance(x.body, dict) else None) or "no answer")
        answers[key] = answers.get(key, 0) + 1
    # Every message the stack accepted, including any whose 202 the client did not get (a timeout under
    # load): each one is judged.
    ids = [str(pk) for pk in Message.objects.filter(text__startswith="r8 #").values_list("pk", flat=True)]
    # Each lost answer holds its sending thread for the stack's read timeout (4 s), and a third of the calls
    # lose theirs: the drain allows 1.2 s per message (the old two-process lane needed about 0.8 s; the
    # threads pool sends more at once), and at least the backoff of an unlucky message's retries.
    state = ctx.drain(ids, timeout=max(s.drain_s, s.r8_messages * 1.2, backoff_covered_s()))
    for instance in ctx.world.a.fleet:
        ctx.sim.faults(instance.name, lose_answer_after_rate=0.0, lose_answer_before_rate=0.0)

    calls = ctx.sends_by_text()
    rows = Message.objects.filter(pk__in=ids).values("status", "failure_reason", "text", "evolution_message_id")
    ends: dict[str, int] = {}
    wrong: list[str] = []
    lost_after = lost_before = reached_total = progressed_once = 0
    for row in rows:
        mine = calls.get(row["text"], [])
        reached = [c for c in mine if c.get("reached")]
        reached_total += len(reached)
        lost_after += sum(1 for c in mine if c.get("answer_lost") == "after")
        lost_before += sum(1 for c in mine if c.get("answer_lost") == "before")
        end = f"{row['status']} {row['failure_reason']}".strip()
        ends[end] = ends.get(end, 0) + 1
        if row["status"] in PROGRESSED:
            ok = len(reached) == 1 and reached[0].get("id") == row["evolution_message_id"]
            progressed_once += ok
        elif row["status"] == "FAILED":
            ok = (row["failure_reason"] == "OUTCOME_UNKNOWN" and len(reached) <= 1) or (
                row["failure_reason"] in NOT_SENT and not reached)
        else:
            ok = False  # not final: counted as lost too
        if not ok:
            wrong.append(f"{row['text']}: {end}, reached WhatsApp {len(reached)}x")
    figures = {
        "messages": len(ids),
        "answers": answers,
        "answers_lost_after_send": lost_after,
        "answers_lost_before_send": lost_before,
        "sent_or_later_reached_once": progressed_once,
        "wrong": len(wrong),
        "lost": state["lost"],
        "ends": ends,
        "reached_whatsapp": reached_total,
    }
    passed = not wrong and state["lost"] == 0 and len(ids) > 0
    return {"passed": passed, "fault": FAULT, "must": MUST, "figures": figures, "notes": wrong[:10]}
