"""B9: a thousand unofficial numbers at a compressed human pace on this machine (issue 47).

Each of project H's numbers (`bench-h-0001`…, the `unofficial` profile, connected and registered with the
simulator) has a backlog of UTILITY messages to recipients it exchanged with before (warm: a `messaging_contact`
row each), so neither the cold-contact quota nor the sticky sender decides anything: the scheduler's timing alone
is measured. The relay, its OTP twin and the lane workers run with `SENDING_POLICY_TIME_SCALE` = `b9_time_scale`
(10: a policy hour passes in six real minutes), and each number's `send_policy` sets its jittered gap to
`b9_gap_min`–`b9_gap_max` policy seconds (300–500: 30–50 s real), so that the thousand numbers together ask for
about 25 sends/s, well under what two cores send in B2 (at 40/s the stack alone took 1.7 of the two cores, and
the machine is shared). The caps stay at their defaults: at this pace a number sends about 9 times per policy
hour, under a new number's 20 (the report counts any hold for another reason than `pacing`). Each number's first slot is spread over one gap (its schedule row written before the backlog), as
numbers that have been sending for a while are, not a thousand first sends at one instant. Typing is off, as in
B2, so that the CPU per message compares with B2's.

What the policy allowed: a trigger, in the bench database only and for this scenario only, keeps every value the
product writes to `messaging_sendschedule.next_send_at` with the time it was written (`bench_b9_slot`). A number's
send takes the slot written last before it reached the gateway (the simulator's receipt time); the next slot is
written when that send ends. Over the measured window:
- the rate: per number, over consecutive sends k, k+1 in the window, the sum of (its allowed moment for k+1 − k's
  receipt) over the sum of (k+1's receipt − k's receipt): 1.0 when every send goes the moment it may; a number with
  fewer than two sends in the window counts 0. Target: every number >= 0.9;
- timer lateness: for every slot falling in the window, its send's receipt at the gateway − the slot (a slot with
  no send by the end of the tail counts as infinitely late). Target: p99 <= 1 s;
- CPU per message: the stack's processes and the servers (Postgres, RabbitMQ, Redis; not the simulator) over the
  window, per message SENT in it, against B2's pipeline fed at B9's rate (`b2_at_rate`: the same shape of backlog on
  A's official fleet, each message due at a moment of its own, no human pace). Target: <= 1.25× it. Shown beside it:
  B2 at full speed (bench.scenarios.b2_pipeline.pipeline, to READ) before and after. At a fifth of B2's rate a
  message also pays costs that B2's rate spreads over many (a consumer's and RabbitMQ's per delivery, a relay pass's
  fixed statements), which no scheduler removes; the same rate leaves the policy as the one difference.
"""

from __future__ import annotations

import random
import time
from bisect import bisect_left
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from ..backlog import bulk_accept, live_key
from ..context import Context, cpu_summary, per_unit, stop_releases
from ..launcher import LANES, stop_together
from ..procstats import CpuMeter
from ..stats import percentile
from ..world import phone
from .b2_pipeline import pipeline

PROJECT = "Bench H"
PREFIX = "bench-h-"
# The processes that decide and apply the policy: they run on its compressed clock for this scenario.
PACED = ("relay", "relay-otp", *(f"worker-{lane}" for lane in LANES))
# Not ours: the gateway's stand-in.
NOT_STACK = ("simulator",)
RATE_TARGET, LATENESS_TARGET_MS, CPU_TARGET = 0.9, 1000.0, 1.25

_SLOTS = """
CREATE TABLE IF NOT EXISTS bench_b9_slot (
    instance_id bigint NOT NULL, next_send_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp());
TRUNCATE bench_b9_slot;
CREATE OR REPLACE FUNCTION bench_b9_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_b9_slot (instance_id, next_send_at) VALUES (NEW.instance_id, NEW.next_send_at);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS bench_b9_slot_insert ON messaging_sendschedule;
DROP TRIGGER IF EXISTS bench_b9_slot_update ON messaging_sendschedule;
CREATE TRIGGER bench_b9_slot_insert AFTER INSERT ON messaging_sendschedule FOR EACH ROW
    WHEN (NEW.next_send_at IS NOT NULL) EXECUTE FUNCTION bench_b9_slot();
CREATE TRIGGER bench_b9_slot_update AFTER UPDATE OF next_send_at ON messaging_sendschedule FOR EACH ROW
    WHEN (NEW.next_send_at IS NOT NULL AND NEW.next_send_at IS DISTINCT FROM OLD.next_send_at)
    EXECUTE FUNCTION bench_b9_slot();
"""
_NO_SLOTS = """
DROP TRIGGER IF EXISTS bench_b9_slot_insert ON messaging_sendschedule;
DROP TRIGGER IF EXISTS bench_b9_slot_update ON messaging_sendschedule;
"""
_WARM = """
INSERT INTO messaging_contact (instance_id, phone, last_exchange_at, last_direction)
SELECT i, p, now(), 'inbound' FROM unnest(%(ids)s::bigint[]) AS i, unnest(%(phones)s::text[]) AS p
ON CONFLICT (instance_id, phone) DO NOTHING
"""
_SCHEDULES = """
INSERT INTO messaging_sendschedule (instance_id, next_send_at, hour_sent, day_sent, day_cold, cold_sent_at)
SELECT unnest(%(ids)s::bigint[]), unnest(%(at)s::timestamptz[]), 0, 0, 0, '{}'
"""


def _sql(statements: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statements, params)
        return cursor.fetchall() if cursor.description else []


# --- the judgement: plain functions of what was recorded (tests/bench/test_b9_human_pace.py) -----------------


def rate_ratio(slots: list[tuple[float, float]], sends: list[float], w0: float, w1: float) -> float:
    """One number's achieved rate over the rate its policy allowed, in [w0, w1]: for consecutive sends k, k+1 in the
    window, Σ(allowed moment of k+1 − k) / Σ(k+1 − k). `slots`: (allowed moment, when it was written), in the
    order written; `sends`: receipt times at the gateway. Fewer than two sends in the window: 0."""
    written = [r for _, r in slots]
    inside = [s for s in sorted(sends) if w0 <= s <= w1]
    allowed_sum = actual_sum = 0.0
    for k, nxt in zip(inside, inside[1:]):
        i = bisect_left(written, nxt) - 1  # the slot written last before the send reached the gateway
        allowed = slots[i][0] if i >= 0 else k
        allowed_sum += max(allowed, k) - k
        actual_sum += nxt - k
    return allowed_sum / actual_sum if actual_sum > 0 else 0.0


def lateness(slots: list[tuple[float, float]], sends: list[float], w0: float, w1: float) -> list[float]:
    """Seconds from each slot allowed in [w0, w1] to the first send that reached the gateway after the slot was
    written (its send): infinite when there was none."""
    ordered = sorted(sends)
    late = []
    for allowed, written in slots:
        if not w0 <= allowed <= w1:
            continue
        i = bisect_left(ordered, written)
        late.append(ordered[i] - allowed if i < len(ordered) else float("inf"))
    return late


def latest(slots: dict[str, list[tuple[float, float]]], sends: dict[str, list[float]], w0: float, w1: float,
           count: int = 10) -> list[tuple[str, float, float]]:
    """The `count` latest slots in [w0, w1]: (number, the slot, its send's receipt), latest first."""
    found = []
    for name, own in slots.items():
        ordered = sorted(sends.get(name, []))
        for allowed, written in own:
            i = bisect_left(ordered, written)
            if w0 <= allowed <= w1 and i < len(ordered):
                found.append((name, allowed, ordered[i]))
    return sorted(found, key=lambda f: f[1] - f[2])[:count]


def judge(slots: dict[str, list[tuple[float, float]]], sends: dict[str, list[float]], numbers: list[str],
          w0: float, w1: float, margin: float) -> dict[str, Any]:
    """Every number's rate ratio over [w0, w1] and the lateness of the slots in [w0, w1 − margin] (a slot at the very
    end may be sent after the window)."""
    ratios = {n: rate_ratio(slots.get(n, []), sends.get(n, []), w0, w1) for n in numbers}
    late = [x for n in numbers for x in lateness(slots.get(n, []), sends.get(n, []), w0, w1 - margin)]
    values = sorted(ratios.values())
    slowest = sorted(ratios, key=lambda n: ratios[n])[:5]
    return {
        "numbers": len(numbers),
        "rate_ratio": {"min": _round(values[0] if values else float("nan"), 3),
                       "p1": _round(percentile(values, 1), 3), "p50": _round(percentile(values, 50), 3)},
        "below_target": sum(1 for v in values if v < RATE_TARGET),
        "without_two_sends": sum(1 for n in numbers if len([s for s in sends.get(n, []) if w0 <= s <= w1]) < 2),
        "slowest": {n: _round(ratios[n], 3) for n in slowest},
        "slots": len(late),
        "unsent_slots": sum(1 for x in late if x == float("inf")),
        "lateness_ms": {"min": _ms(min(late, default=float("nan"))), "p50": _ms(percentile(late, 50)),
                        "p99": _ms(percentile(late, 99)), "max": _ms(max(late, default=float("nan")))},
    }


def _round(value: float, digits: int) -> float:
    return value if value != value or value in (float("inf"), float("-inf")) else round(value, digits)


def _ms(seconds: float) -> float:
    return _round(seconds * 1000, 1)


def stack_ms(meter: CpuMeter, count: int) -> float:
    """CPU milliseconds per unit of the stack's processes and the servers, the simulator left out."""
    if count <= 0:
        return float("nan")
    return round(1000 * sum(v for kind, v in meter.by_kind.items() if kind not in NOT_STACK) / count, 2)


# --- the run -------------------------------------------------------------------------------------------------


def restart(ctx: Context, names: tuple[str, ...]) -> None:
    stop_together([ctx.stack.processes[name] for name in names])
    for name in names:
        ctx.stack.start_process(name)


@contextmanager
def policy_clock(ctx: Context, scale: float) -> Iterator[None]:
    """The paced processes (and this one) on the policy's compressed clock for the block, then back."""
    from django.conf import settings

    saved_env, saved_scale = dict(ctx.stack.env), settings.SENDING_POLICY_TIME_SCALE
    ctx.stack.env["SENDING_POLICY_TIME_SCALE"] = str(scale)
    settings.SENDING_POLICY_TIME_SCALE = scale
    restart(ctx, PACED)
    try:
        yield
    finally:
        ctx.stack.env.clear()
        ctx.stack.env.update(saved_env)
        settings.SENDING_POLICY_TIME_SCALE = saved_scale
        restart(ctx, PACED)


def numbers(count: int, policy: dict[str, float], recipients: list[str]) -> tuple[Any, list[Any]]:
    """Project H and its `count` unofficial numbers (created once, reused), healthy and open, each warm with every
    recipient, the recipients opted in."""
    from messaging import operators, opt_ins
    from messaging.models import ApiKey, Environment, Instance, Project

    project = Project.objects.filter(name=PROJECT).first()
    if project is None:
        created = operators.create_project(PROJECT, phone(9_900), production_approved=True)
        project = Project.objects.get(pk=created["project_id"])
    ApiKey.issue(project, Environment.LIVE)
    names = [f"{PREFIX}{n:04d}" for n in range(1, count + 1)]
    existing = set(Instance.objects.filter(name__in=names).values_list("name", flat=True))
    # bulk_create: a thousand add_instance calls would take longer than the run; the rows are the same.
    Instance.objects.bulk_create([Instance(name=name, project=project, priority=50) for name in names
                                  if name not in existing])
    made = Instance.objects.filter(name__in=names)
    made.update(send_profile="unofficial", send_policy=policy, connection_state="open", health_state="healthy",
                cold_paused_until=None)
    live = set(project.opt_ins.filter(revoked_at__isnull=True).values_list("phone", flat=True))
    for number in recipients:
        if number not in live:
            opt_ins.record(project, number, "bench")
    instances = list(made.order_by("name"))
    _sql(_WARM, {"ids": [i.pk for i in instances], "phones": recipients})
    return project, instances


def b2_pass(ctx: Context, count: int) -> dict[str, Any]:
    """B2's pipeline (accept to READ on A's official fleet), its CPU per message measured as B9's is."""
    ctx.fresh()
    with ctx.cpu(servers=True) as meter:
        result = pipeline(ctx, count)
    return {"sent_rate": result["sent_rate"], "all_read": result["all_read"],
            "cpu_ms_per_message": per_unit(meter, count), "stack_ms_per_message": stack_ms(meter, count)}


def b2_at_rate(ctx: Context, rate: float, seconds: float, warmup: float) -> dict[str, Any]:
    """B2's pipeline at B9's rate: the same shape of backlog as B9's (written before, each message coming due at a
    moment of its own, released by the relay as it does), on A's official fleet with no human pace, so that the one
    difference from the paced window is the policy. UTILITY, as B9's; the CPU per message SENT over `seconds` after
    `warmup`, measured as B9's."""
    from django.utils import timezone

    from messaging.inserts import notify_relay
    from messaging.models import Message, OutboxEntry

    ctx.fresh()
    world = ctx.world
    count = int(rate * (warmup + seconds + 5))
    ids = bulk_accept(world.a.project, live_key(world.a.project), world.a.recipients, count, "UTILITY",
                      instances=[i.name for i in world.fleet], longest_ttl=True, enqueue=False)
    start = timezone.now() + timedelta(seconds=2)
    due = {pk: start + timedelta(seconds=n / rate) for n, pk in enumerate(ids)}
    messages = list(Message.objects.filter(pk__in=ids).only("pk", "next_attempt_at"))
    for message in messages:
        message.next_attempt_at = due[str(message.pk)]
    Message.objects.bulk_update(messages, ["next_attempt_at"], batch_size=2_000)
    OutboxEntry.objects.bulk_create([OutboxEntry(message_id=pk, project_id_copy=world.a.project.pk, lane="utility",
                                                 available_at=at) for pk, at in due.items()], batch_size=2_000)
    notify_relay("utility")
    time.sleep(max(0.0, (start - timezone.now()).total_seconds() + warmup))
    w0 = timezone.now()
    with ctx.cpu(servers=True) as meter:
        time.sleep(seconds)
    w1 = timezone.now()
    sent = Message.objects.filter(pk__in=ids, sent_at__gte=w0, sent_at__lte=w1).count()
    stop_releases()
    return {"rate_asked": round(rate, 1), "sends_per_s": round(sent / (w1 - w0).total_seconds(), 1),
            "window_s": round((w1 - w0).total_seconds(), 1), "sent_in_window": sent,
            "backlog_left": max(due.values(), default=w0) > w1,
            "stack_ms_per_message": stack_ms(meter, sent), "cpu_ms_per_message": per_unit(meter, sent)}


def paced_run(ctx: Context) -> dict[str, Any]:
    from django.utils import timezone

    from messaging.models import Message

    s = ctx.sizes
    scale = s.b9_time_scale
    gap_real = (s.b9_gap_min / scale, s.b9_gap_max / scale)
    recipients = [phone(20_000 + i) for i in range(s.b9_recipients)]
    policy = {"gap_min_seconds": s.b9_gap_min, "gap_max_seconds": s.b9_gap_max}
    ctx.fresh()
    project, instances = numbers(s.b9_numbers, policy, recipients)
    for instance in instances:
        ctx.sim.register(instance, ctx.stack.webhook_url)
    ids = [i.pk for i in instances]
    names = {i.pk: i.name for i in instances}
    # Enough for every number to have its next message waiting through the warm-up, the window and the tail.
    per_number = int((s.b9_warmup_seconds + s.b9_seconds + 10) / gap_real[0]) + 2
    _sql("DELETE FROM messaging_sendschedule WHERE instance_id = ANY(%(ids)s)", {"ids": ids})
    # What the stack costs with nothing to send: part of every window's CPU, whatever the rate.
    with ctx.cpu(servers=True) as idle:
        time.sleep(s.b9_idle_seconds)
    _sql(_SLOTS)
    try:
        lead = timedelta(seconds=s.b9_lead_seconds)  # the backlog is written meanwhile
        start = timezone.now() + lead
        _sql(_SCHEDULES, {"ids": ids, "at": [start + timedelta(seconds=random.uniform(0, gap_real[1]))
                                             for _ in ids]})
        accept_began = time.monotonic()
        message_ids = bulk_accept(project, live_key(project), recipients, per_number * len(instances), "UTILITY",
                                  instances=[i.name for i in instances], longest_ttl=True)
        accept_s = time.monotonic() - accept_began
        time.sleep(max(0.0, (start - timezone.now()).total_seconds() + s.b9_warmup_seconds))
        w0 = timezone.now()
        with ctx.cpu(servers=True) as meter:
            time.sleep(s.b9_seconds)
        w1 = timezone.now()
        sent = Message.objects.filter(project=project, sent_at__gte=w0, sent_at__lte=w1).count()
        time.sleep(s.b9_tail_seconds)
        slots: dict[str, list[tuple[float, float]]] = {}
        for instance_id, allowed, written in _sql(
                "SELECT instance_id, next_send_at, recorded_at FROM bench_b9_slot ORDER BY recorded_at"):
            slots.setdefault(names[instance_id], []).append((allowed.timestamp(), written.timestamp()))
        sends: dict[str, list[float]] = {}
        ids_at: dict[tuple[str, float], str] = {}
        for record in ctx.sim.sends():
            if str(record["instance"]).startswith(PREFIX):
                sends.setdefault(record["instance"], []).append(float(record["at"]))
                ids_at[(record["instance"], float(record["at"]))] = str(record.get("id") or "")
        holds = _other_holds(message_ids)
        worst = phases(latest(slots, sends, w0.timestamp(), w1.timestamp() - s.b9_tail_margin), ids_at, w0.timestamp())
    finally:
        _sql(_NO_SLOTS)
        stop_releases()
    window = (w1 - w0).total_seconds()
    figures = judge(slots, sends, [i.name for i in instances], w0.timestamp(), w1.timestamp(), s.b9_tail_margin)
    expected = len(instances) / (sum(gap_real) / 2)
    return {
        **figures,
        "time_scale": scale, "gap_policy_s": [s.b9_gap_min, s.b9_gap_max], "gap_real_s": list(gap_real),
        "recipients": len(recipients), "backlog_per_number": per_number, "messages": len(message_ids),
        "accept_s": round(accept_s, 1), "window_s": round(window, 1),
        "sent_in_window": sent, "sends_per_s": round(sent / window, 1) if window else None,
        "expected_sends_per_s": round(expected, 1),
        "other_holds": holds,
        "latest_slots": worst,
        "stack_ms_per_message": stack_ms(meter, sent),
        # The idle stack's CPU per second, as milliseconds per message at the window's rate.
        "idle_stack_ms_per_s": stack_ms(idle, max(1, round(idle.wall))),
        "idle_ms_per_message": round(stack_ms(idle, max(1, round(idle.wall))) * window / sent, 2) if sent else None,
        "cpu_ms_per_message": per_unit(meter, sent),
        "cpu": cpu_summary(meter),
    }


def phases(worst: list[tuple[str, float, float]], ids_at: dict[tuple[str, float], str],
           w0: float) -> list[dict[str, Any]]:
    """Where the latest slots' time went: from the slot to the relay's release (DISPATCHED), and from there to the
    gateway's receipt."""
    from messaging.models import Message

    gateway_ids = [ids_at.get((name, at), "") for name, _, at in worst]
    dispatched = dict(Message.objects.filter(evolution_message_id__in=[g for g in gateway_ids if g])
                      .values_list("evolution_message_id", "dispatched_at"))
    out = []
    for (name, allowed, at), gateway_id in zip(worst, gateway_ids):
        released = dispatched.get(gateway_id)
        out.append({"number": name, "slot_s": round(allowed - w0, 2), "late_ms": _ms(at - allowed),
                    "to_release_ms": _ms(released.timestamp() - allowed) if released else None,
                    "release_to_gateway_ms": _ms(at - released.timestamp()) if released else None})
    return out


def _other_holds(message_ids: list[str]) -> dict[str, int]:
    """WAITING lines of the backlog for another reason than `pacing` (a cap, the cold quota, health): the gap is
    meant to be the one limit."""
    from django.db.models import Count

    from messaging.models import EventKind, MessageEvent

    rows = (MessageEvent.objects.filter(message_id__in=message_ids, kind=EventKind.WAITING)
            .exclude(detail__why="pacing").values("detail__why").annotate(n=Count("pk")))
    return {str(r["detail__why"]): r["n"] for r in rows}


def run(ctx: Context) -> dict[str, Any]:
    s = ctx.sizes
    before = b2_pass(ctx, s.b9_b2_messages)
    ctx.log(f"  B9 B2 pass before: {before['stack_ms_per_message']} ms of stack CPU per message")
    with policy_clock(ctx, s.b9_time_scale):
        paced = paced_run(ctx)
    ctx.log(f"  B9 paced: {paced['sends_per_s']}/s over {paced['numbers']} numbers, rate ratio {paced['rate_ratio']}, "
            f"lateness {paced['lateness_ms']} ms, {paced['stack_ms_per_message']} ms CPU per message")
    after = b2_pass(ctx, s.b9_b2_messages)
    ctx.log(f"  B9 B2 pass after: {after['stack_ms_per_message']} ms of stack CPU per message")
    same = b2_at_rate(ctx, paced["sends_per_s"] or paced["expected_sends_per_s"], s.b9_same_rate_seconds,
                      s.b9_same_rate_warmup)
    ctx.log(f"  B9 B2 at B9's rate: {same['sends_per_s']}/s, {same['stack_ms_per_message']} ms of stack CPU per message")
    ctx.fresh()
    baseline = round((before["stack_ms_per_message"] + after["stack_ms_per_message"]) / 2, 2)
    cpu_ratio = round(paced["stack_ms_per_message"] / baseline, 2) if baseline else float("nan")
    same_rate_ratio = (round(paced["stack_ms_per_message"] / same["stack_ms_per_message"], 2)
                       if same["stack_ms_per_message"] else float("nan"))
    rate_met = paced["rate_ratio"]["min"] >= RATE_TARGET
    late_met = paced["lateness_ms"]["p99"] <= LATENESS_TARGET_MS
    cpu_met = same_rate_ratio <= CPU_TARGET
    return {
        **paced,
        "b2_before": before, "b2_after": after, "b2_stack_ms_per_message": baseline, "cpu_ratio": cpu_ratio,
        "b2_at_rate": same, "same_rate_cpu_ratio": same_rate_ratio, "cpu_judged_at": "same_rate",
        "target": {"rate_ratio": RATE_TARGET, "lateness_p99_ms": LATENESS_TARGET_MS, "cpu_ratio": CPU_TARGET},
        "rate_met": rate_met, "lateness_met": late_met, "cpu_met": cpu_met,
        "met": rate_met and late_met and cpu_met,
    }
