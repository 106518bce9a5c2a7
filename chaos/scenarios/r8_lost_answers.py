"""R8: answers lost on the way back, after Evolution sent the message or before it did. Every message
that ends SENT or later reached WhatsApp exactly once (counted at the simulator, which logs every
sendText and whether it reached WhatsApp); every other one is FAILED with a reason that says what is
known: OUTCOME_UNKNOWN (it may have been delivered) or a reason that says it was not sent, and then
it never reached WhatsApp.

Two rows (issue 48): R8 against an Evolution that sends with the WhatsApp id we choose, where every lost
answer must be resolved by that id, none left unknown; R8I against one that ignores it (older than
`messageId`), where lost answers are judged by inference and may stay unknown, never wrong."""

from __future__ import annotations

from typing import Any

from ..context import ACKS_DELIVERED, Context

FAULT = "every fifth sendText answer lost after WhatsApp got the message, every fifth other one lost before"
MUST = "each message SENT or later reached WhatsApp exactly once; every other one is FAILED saying what is known"
FAULT_IDS = "; Evolution sends with the WhatsApp id we choose (messageId)"
MUST_IDS = "; every lost answer resolved by that id, none unknown"
FAULT_NO_IDS = "; Evolution ignores the id we choose (older than messageId)"
# An Evolution that ignores our id is judged by inference, which takes a record as our send only with WhatsApp's
# server ack (sending.evidence.from_the_api): Evolution gets one for every message it sends itself.
ACKS_WITH_SERVER_ACK = {**ACKS_DELIVERED, "SERVER_ACK": 5}
PROGRESSED = ("SENT", "SERVER_ACK", "DELIVERED", "READ")
# Reasons that say the message was not sent: it must never have reached WhatsApp.
NOT_SENT = ("EXPIRED", "RETRIES_EXHAUSTED", "INSTANCE_NOT_FOUND", "INVALID_RECIPIENT")
LOST_AFTER, LOST_BEFORE = 0.2, 0.8 * 0.2  # one draw per call: a fifth, then a fifth of the rest
HANG_S = 6.0  # longer than the stack's EVOLUTION_READ_TIMEOUT: the caller gives up, the answer is lost
# A message whose answer is lost before the send on every try waits out the backoff between its tries
# (messaging.sending.backoff: 5 s, 15 s, 45 s, 2¼ min, each up to 20 % longer). With 40 messages, one may draw four
# in a row and stay QUEUED, rightly, past a 120-s drain. The drain covers
# RETRIES_COVERED retries, so that the row judges what the product did, not a drain shorter than its backoff; it
# ends as soon as every message is final.
RETRIES_COVERED = 4


def backoff_covered_s() -> float:
    from messaging.sending import backoff

    waits = sum(backoff.unjittered_delay_for(attempt) * (1 + backoff.JITTER) for attempt in range(1, RETRIES_COVERED + 1))
    return waits + (RETRIES_COVERED + 1) * HANG_S + 30.0


def run(ctx: Context) -> dict[str, Any]:
    return _run(ctx, ignore_ids=False)


def run_ignoring_ids(ctx: Context) -> dict[str, Any]:
    return _run(ctx, ignore_ids=True)


def _run(ctx: Context, ignore_ids: bool) -> dict[str, Any]:
    from messaging.models import Instance, Message, MessageEvent

    s = ctx.sizes
    ctx.fresh(ACKS_WITH_SERVER_ACK if ignore_ids else ACKS_DELIVERED)
    fleet = ctx.world.a.fleet
    # Whether an instance honours our ids is learnt from its answers, as in production: from nothing.
    Instance.objects.filter(pk__in=[i.pk for i in fleet]).update(honours_message_id=None)
    for instance in fleet:
        ctx.sim.instance(instance.name, ignore_message_id=ignore_ids)
        ctx.sim.faults(instance.name, lose_answer_after_rate=LOST_AFTER, lose_answer_before_rate=LOST_BEFORE,
                       hang_ms=int(HANG_S * 1000))
        if s.r8_events_lost:
            ctx.sim.faults(instance.name, webhook_drop_rate=1.0, rabbitmq_drop_rate=1.0)
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
    for instance in fleet:
        ctx.sim.faults(instance.name, lose_answer_after_rate=0.0, lose_answer_before_rate=0.0, webhook_drop_rate=0.0,
                       rabbitmq_drop_rate=0.0)
        ctx.sim.instance(instance.name, ignore_message_id=False)

    calls = ctx.sends_by_text()
    rows = Message.objects.filter(pk__in=ids).values("status", "failure_reason", "text", "evolution_message_id")
    ends: dict[str, int] = {}
    wrong: list[str] = []
    lost_after = lost_before = reached_total = progressed_once = most_reached = 0
    for row in rows:
        mine = calls.get(row["text"], [])
        reached = [c for c in mine if c.get("reached")]
        reached_total += len(reached)
        most_reached = max(most_reached, len(reached))
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
    # How each lost answer was settled: the worker's checks (verdict, by our id or by inference), the
    # receipts that overtook it, and the checks that left it unknown for a while.
    checks: dict[str, int] = {}
    for detail in MessageEvent.objects.filter(message_id__in=ids, kind="CHECKED").values_list("detail", flat=True):
        key = f"{detail.get('verdict')} by {detail.get('by', 'inference')}"
        checks[key] = checks.get(key, 0) + 1
    left_unknown = MessageEvent.objects.filter(
        message_id__in=ids, kind="WAITING", detail__why="outcome of the last attempt unknown",
    ).values("message_id").distinct().count()
    overtaken = MessageEvent.objects.filter(message_id__in=ids, kind="STATUS", detail__by="receipt").count()
    outcome_unknown = ends.get("FAILED OUTCOME_UNKNOWN", 0)
    figures = {
        "ids": "ignored" if ignore_ids else "honoured",
        "events_lost": bool(s.r8_events_lost),
        "messages": len(ids),
        "answers": answers,
        "answers_lost_after_send": lost_after,
        "answers_lost_before_send": lost_before,
        "sent_or_later_reached_once": progressed_once,
        "wrong": len(wrong),
        "lost": state["lost"],
        "ends": ends,
        "reached_whatsapp": reached_total,
        "most_reached_for_one_message": most_reached,
        "checks": checks,
        "settled_by_receipts": overtaken,
        "messages_left_unknown_a_while": left_unknown,
        "outcome_unknown": outcome_unknown,
    }
    passed = not wrong and state["lost"] == 0 and len(ids) > 0 and most_reached <= 1
    if not ignore_ids:
        passed = passed and left_unknown == 0 and outcome_unknown == 0
    return {"passed": passed, "fault": FAULT + (FAULT_NO_IDS if ignore_ids else FAULT_IDS),
            "must": MUST + ("" if ignore_ids else MUST_IDS), "figures": figures, "notes": wrong[:10]}
