"""R11: a marketing campaign from a new unofficial number to contacts it never talked to, over a compressed week
(issue 47, "Shown by"; docs/sending-policy.md).

A project of its own ("Chaos R11", so that no other number of the project can take over its messages) gets a new
number (a fresh instance, no exchanges, no schedule), and `r11_messages` MARKETING messages to as many cold
contacts, each with opt-in, posted through the API at once with a deliverUntil `r11_days` days (of compressed time)
later: the campaign has a week to go out. Time runs `r11_time_scale` times as fast on both sides, consistently:
the product's stack (web, relay, consumer, lane workers) and the harness's own maintenance run with
SENDING_POLICY_TIME_SCALE, and the simulator's ban model (simulator/README.md, "The ban model", its documented
defaults) with the same `time_scale`, judging only this number.

1. The default policy (the `unofficial` profile, its defaults): the number must end the week unrestricted (no
   disconnect, no ban by the model) and every message SENT (or later), or ended visibly with its reason (EXPIRED, or
   NO_WARM_INSTANCE when no number could reach the cold contact in time, each with a detail naming the limit).
2. The same campaign from another new number with the policy off (its profile `official`, the only way to turn the
   human pace off): the model must restrict it (a disconnect or a ban), and still no message may be lost.

The full size (2,000 messages, 7 days at 2,000x: 302 s a week) keeps the row near 15 minutes on 2 cores; the
warm-up caps let a new number write to about 200 cold contacts in its first week, so most of the campaign ends
EXPIRED (or NO_WARM_INSTANCE), which is what the policy is for.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

from ..context import ACKS_DELIVERED, Context, Sent
from ..world import phone
from .common import answers

FAULT = "a new unofficial number, {n} MARKETING messages to {n} cold contacts over {days:g} compressed days ({scale:g}x)"
MUST = ("default policy: no disconnect nor ban by the ban model, every message SENT or ended with its reason; "
        "policy off (profile official): the number restricted; 0 lost in both")
PROJECT = "Chaos R11"
SENT_OR_LATER = ("SENT", "SERVER_ACK", "DELIVERED", "READ")
STACK_PROCESSES = ("web", "relay", "consumer", "worker-otp", "worker-utility", "worker-marketing")
RECIPIENT_OFFSET = 50_000  # phone(50_000 + i): numbers no other row writes to
DRAIN_AFTER_DEADLINE_S = 120.0  # the reconciler's pass, and a claim that met the deadline, after deliverUntil


def project_and_recipients(ctx: Context, n: int) -> tuple[Any, str, list[str]]:
    """The row's project (made once), a fresh LIVE key, and its n recipients with opt-in."""
    from messaging import operators, opt_ins
    from messaging.models import ApiKey, Environment, Project

    project = Project.objects.filter(name=PROJECT).first()
    if project is None:
        created = operators.create_project(PROJECT, phone(RECIPIENT_OFFSET - 1), production_approved=True)
        project = Project.objects.get(pk=created["project_id"])
    _, key = ApiKey.issue(project, Environment.LIVE)
    ctx.world.raw_secrets.append(key)  # S5 looks for it in the tables and the logs
    numbers = [phone(RECIPIENT_OFFSET + i) for i in range(n)]
    consented = set(project.opt_ins.filter(revoked_at__isnull=True).values_list("phone", flat=True))
    for number in numbers:
        if number not in consented:
            opt_ins.record(project, number, "chaos r11")
    return project, key, numbers


def new_number(ctx: Context, project: Any, label: str, profile: str) -> Any:
    """A fresh instance of the project (no exchanges, no schedule), on the simulator with the ban model on."""
    from messaging import operators
    from messaging.models import Instance

    name = f"r11-{label}-{uuid.uuid4().hex[:6]}"
    token = f"TOKEN-{name}".upper()
    operators.add_instance(name, project.pk, priority=1, token=token, profile=profile)
    Instance.objects.filter(name=name).update(connection_state="open", last_gateway_error="")
    instance = Instance.objects.get(name=name)
    ctx.world.raw_secrets.extend([instance.webhook_token, token])
    ctx.register(instance, ACKS_DELIVERED)
    ctx.sim.ban_model(name, enabled=True)
    return instance


def post_campaign(ctx: Context, key: str, instance: str, numbers: list[str], deliver_until: datetime,
                  tag: str) -> list[Sent]:
    def one(i: int) -> Sent:
        body = {"to": numbers[i], "category": "MARKETING", "text": f"{tag} offer #{i}", "instance": instance,
                "deliverUntil": deliver_until.isoformat()}
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": uuid.uuid4().hex}
        for attempt in range(1, 4):
            try:
                r = ctx.session().post(f"{ctx.stack.web_url}/v1/messages/send", json=body, headers=headers, timeout=15)
            except Exception as exc:  # no answer: retried with the same key, as a careful client does
                if attempt == 3:
                    return Sent(0, {"exception": type(exc).__name__}, numbers[i], body["text"], time.monotonic(), attempt)
                time.sleep(1.0)
                continue
            try:
                payload = r.json()
            except ValueError:
                payload = {"raw": r.text[:200]}
            return Sent(r.status_code, payload, numbers[i], body["text"], time.monotonic(), attempt)
        raise AssertionError("unreachable")

    with ThreadPoolExecutor(ctx.sizes.senders) as ex:
        return list(ex.map(one, range(len(numbers))))


def outcome(ids: list[str]) -> dict[str, Any]:
    """Where the campaign's messages are: sent (SENT or later), ended with a reason (FAILED, its reason, a detail and
    a dead letter), or lost (anything else: still queued or sending, or failed without a reason)."""
    from messaging.models import Message

    rows = list(Message.objects.filter(pk__in=ids).values_list("status", "failure_reason", "failure_detail",
                                                              "dead_letter__id"))
    by_status = Counter(status for status, *_ in rows)
    ended = Counter(reason for status, reason, detail, dead in rows
                    if status == "FAILED" and reason and detail and dead is not None)
    # The limit named in each detail (the sending policy's reason, or the detail's first words).
    limits = Counter(reason + ": " + limit_of(detail) for status, reason, detail, _ in rows if status == "FAILED")
    sent = sum(by_status[s] for s in SENT_OR_LATER)
    return {"accepted": len(ids), "sent": sent, "ended_with_reason": dict(ended), "limits": dict(limits.most_common(6)),
            "by_status": dict(by_status), "lost": len(ids) - sent - sum(ended.values())}


def limit_of(detail: str) -> str:
    if "held the message: " in detail:
        return detail.split("held the message: ", 1)[1].split(" ", 1)[0]
    if "(" in detail and " on " in detail:  # NO_WARM_INSTANCE: "(<reason> on <number> until …)"
        return detail.rsplit("(", 1)[1].split(" ", 1)[0]
    return detail[:60]


def model_view(ctx: Context, name: str) -> dict[str, Any]:
    standing = ctx.sim.standing(name)
    kinds = Counter(entry["kind"] for entry in standing.get("history", []))
    triggers = Counter(t["rule"] for entry in standing.get("history", []) if entry["kind"] == "strike"
                       for t in entry.get("triggers", []))
    return {"status": standing["status"], "strikes_463": standing["strikes"], "disconnects": standing["disconnects"],
            "banned": standing["banned"], "restricted": bool(standing["banned"] or standing["disconnects"]),
            "strike_rules": dict(triggers), "history": dict(kinds), "most_in_flight": standing.get("max_in_flight"),
            "cold_allowance_at_end": standing["allowance"]["cold"]}


def campaign(ctx: Context, project: Any, key: str, numbers: list[str], label: str, profile: str) -> dict[str, Any]:
    """One run: a new number, the whole campaign posted, then wait until its deadline and every message ended."""
    s = ctx.sizes
    ctx.fresh(ACKS_DELIVERED)
    ctx.sim.time_scale(s.r11_time_scale)
    instance = new_number(ctx, project, label, profile)
    week_s = s.r11_days * 86400.0 / s.r11_time_scale
    started = time.monotonic()
    deliver_until = datetime.now(timezone.utc) + timedelta(seconds=week_s)
    out = post_campaign(ctx, key, instance.name, numbers, deliver_until, f"r11 {label}")
    posted_s = time.monotonic() - started
    ids = [x.id for x in out if x.id]
    ctx.log(f"  R11 {label}: {len(ids)} of {len(out)} accepted in {posted_s:.0f} s; deadline in {week_s:.0f} s")
    deadline = started + week_s + DRAIN_AFTER_DEADLINE_S
    state = outcome(ids)
    with ctx.maintenance():
        while time.monotonic() < deadline:
            state = outcome(ids)
            if state["lost"] == 0:
                break
            time.sleep(2.0)
    state = outcome(ids)
    instance.refresh_from_db()
    calls = ctx.sim.sends(instance=instance.name)
    return {
        "number": instance.name, "profile": profile, "answers": answers(out), **state,
        "model": model_view(ctx, instance.name),
        "sendtext_calls": len(calls), "sendtext_by_status": dict(Counter(str(c.get("status")) for c in calls)),
        "product_health": instance.health_state, "product_connection": instance.connection_state,
        "ended_after_s": round(time.monotonic() - started, 1), "week_real_s": round(week_s, 1),
    }


def run(ctx: Context) -> dict[str, Any]:
    from django.conf import settings

    s = ctx.sizes
    scale = s.r11_time_scale
    notes: list[str] = []
    project, key, numbers = project_and_recipients(ctx, s.r11_messages)
    saved_env, saved_scale = dict(ctx.stack.env), settings.SENDING_POLICY_TIME_SCALE
    ctx.stack.env["SENDING_POLICY_TIME_SCALE"] = str(scale)
    settings.SENDING_POLICY_TIME_SCALE = scale
    try:
        for name in STACK_PROCESSES:
            ctx.stack.restart(name)
        policy = campaign(ctx, project, key, numbers, "policy", "unofficial")
        ctx.log(f"  R11 policy: {policy}")
        off = campaign(ctx, project, key, numbers, "off", "official")
        ctx.log(f"  R11 off: {off}")
    finally:
        ctx.stack.env.clear()
        ctx.stack.env.update(saved_env)
        settings.SENDING_POLICY_TIME_SCALE = saved_scale
        ctx.sim.time_scale(1.0)
        for name in STACK_PROCESSES:
            ctx.stack.restart(name)
    ok_policy = (not policy["model"]["restricted"] and policy["lost"] == 0 and policy["accepted"] == s.r11_messages)
    ok_off = off["model"]["restricted"] and off["lost"] == 0 and off["accepted"] == s.r11_messages
    if policy["model"]["strikes_463"]:
        notes.append(f"under the default policy the ban model struck {policy['model']['strikes_463']} send(s) with "
                     f"463 ({policy['model']['strike_rules']})")
    figures = {
        "messages": s.r11_messages, "days": s.r11_days, "time_scale": scale,
        "policy_sent": policy["sent"], "policy_ended": policy["ended_with_reason"], "policy_lost": policy["lost"],
        "policy_strikes_463": policy["model"]["strikes_463"], "policy_disconnects": policy["model"]["disconnects"],
        "policy_restricted": policy["model"]["restricted"],
        "off_sent": off["sent"], "off_ended": off["ended_with_reason"], "off_lost": off["lost"],
        "off_strikes_463": off["model"]["strikes_463"], "off_disconnects": off["model"]["disconnects"],
        "off_banned": off["model"]["banned"], "off_restricted": off["model"]["restricted"],
        "policy_run": policy, "off_run": off,
    }
    return {"passed": bool(ok_policy and ok_off), "figures": figures, "notes": notes,
            "fault": FAULT.format(n=s.r11_messages, days=s.r11_days, scale=scale), "must": MUST}
