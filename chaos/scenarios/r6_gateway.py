"""R6: the gateway misbehaves in every way we know of; every message ends in the right final state
and reason. HTTP faults come from the simulator's controls, link faults (a black-holed connection, a
slow link) from chaos.proxy. Each HTTP case has an instance of its own, named in the send, so that
no fallback or shared breaker blurs the cases."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import requests

from ..context import ACKS_DELIVERED, Context, wait_for

FAULT = "gateway matrix: 5xx bursts, timeouts, 404, not on WhatsApp, Connection Closed 500/400, slow, deleted, link faults"
MUST = "every message ends in the right final state and reason"
OK = ("DELIVERED", "READ")
NOT_ON_WA = "+5511960009999"


@dataclass
class Case:
    name: str
    expect: tuple[str, str]  # (status group "OK" or "FAILED", reason)
    faults: dict[str, Any] = field(default_factory=dict)
    register: bool = True
    max_sends_per_message: int = 1  # 201 answers Evolution gave per message
    max_attempts: int = 10  # a disconnected answer must not use an attempt
    to: str | None = None


CASES = [
    Case("5xx burst", ("OK", ""), {"error_sequence": [500, 503, 502]}),
    Case("timeout, nothing sent", ("OK", ""), {"hang_rate": 1.0, "hang_ms": 8000}),
    Case("timeout after the send", ("OK", ""), {"hang_rate": 1.0, "hang_ms": 8000, "hang_after_send": True}),
    Case("404 instance unknown to Evolution", ("FAILED", "INSTANCE_NOT_FOUND"), register=False),
    Case("deleted instance", ("FAILED", "INSTANCE_NOT_FOUND")),
    Case("not on WhatsApp", ("FAILED", "INVALID_RECIPIENT"), {"not_on_whatsapp": [NOT_ON_WA]}, to=NOT_ON_WA),
    # Evolution's exact bodies (simulator/README.md): the socket dropped between our state check and the send.
    Case("Connection Closed (500)", ("OK", ""), {"error_rate": 1.0, "error_status": 500, "error_body": {
        "status": 500, "error": "Internal Server Error", "response": {"message": "Connection Closed"}}}, max_attempts=1),
    Case("Connection Closed (400)", ("OK", ""), {"error_rate": 1.0, "error_status": 400, "error_body": {
        "status": 400, "error": "Bad Request", "response": {"message": ["Error: Connection Closed"]}}}, max_attempts=1),
    Case("slow answers (2.5 s)", ("OK", ""), {"latency_ms": 2500}),
]
LINK_CASES = [("link black hole (6 s)", "hang"), ("slow link (1 s per chunk)", "slow")]


def _instance(ctx: Context, slug: str) -> Any:
    from messaging import operators
    from messaging.models import Instance

    name = f"chaos-r6-{slug}"
    if not Instance.objects.filter(name=name).exists():
        operators.add_instance(name, ctx.world.a.project.pk, priority=60, token=f"TOKEN-{name}".upper())
        instance = Instance.objects.get(name=name)
        ctx.world.raw_secrets.extend([instance.webhook_token, f"TOKEN-{name}".upper()])
    Instance.objects.filter(name=name).update(connection_state="open", send_profile="official",
                                                  send_policy={"pair_gap_seconds": 0})
    return Instance.objects.get(name=name)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")[:40]


def _outcome(ids: list[str]) -> list[dict[str, Any]]:
    from messaging.models import Message

    return list(Message.objects.filter(pk__in=ids).values("id", "status", "failure_reason", "attempts", "text",
                                                          "dead_letter__id"))


def _judge(case_expect: tuple[str, str], rows: list[dict[str, Any]], sends: dict[str, list[dict[str, Any]]],
           max_sends: int, max_attempts: int = 10) -> tuple[bool, dict[str, Any]]:
    group, reason = case_expect
    ends, ok = {}, True
    for r in rows:
        end = f"{r['status']} {r['failure_reason']}".strip()
        ends[end] = ends.get(end, 0) + 1
        if group == "OK":
            ok &= r["status"] in OK
        else:
            ok &= r["status"] == "FAILED" and r["failure_reason"] == reason and r["dead_letter__id"] is not None
        accepted = sum(1 for c in sends.get(r["text"], []) if c.get("status") == 201)
        ok &= accepted <= max_sends and r["attempts"] <= max_attempts
    answered: dict[str, int] = {}
    for r in rows:
        for c in sends.get(r["text"], []):
            answered[str(c.get("status"))] = answered.get(str(c.get("status")), 0) + 1
    return ok, {"ends": ends, "attempts": sorted({r["attempts"] for r in rows}),
                "sendtext_calls": sum(len(sends.get(r["text"], [])) for r in rows), "evolution_answered": answered}


def run(ctx: Context) -> dict[str, Any]:
    from messaging.models import Message

    s = ctx.sizes
    ctx.fresh(ACKS_DELIVERED)
    recipient = ctx.world.a.recipients[0]
    from messaging import opt_ins

    opt_ins.record(ctx.world.a.project, NOT_ON_WA, "r6")
    plan: dict[str, tuple[Case, Any, list[str]]] = {}
    for case in CASES:
        inst = _instance(ctx, _slug(case.name))
        if case.register:
            ctx.register(inst, ACKS_DELIVERED)
            faults = dict(case.faults)
            if "error_sequence" in faults:
                faults["error_sequence"] = ([500, 503, 502] * s.r6_burst)[:s.r6_burst]
            if faults:
                ctx.sim.faults(inst.name, **faults)
        plan[case.name] = (case, inst, [])
    # Deleted through Evolution's own route (it logs out and emits connection.update close 401 first).
    deleted = plan["deleted instance"][1]
    requests.delete(f"{ctx.sim.base_url}/instance/delete/{deleted.name}", headers={"apikey": _global_key()}, timeout=10)
    for case, inst, ids in plan.values():
        for i in range(s.r6_per_case):
            sent = ctx.send(case.to or recipient, f"r6 {case.name} #{i}", instance=inst.name)
            if sent.id:
                ids.append(sent.id)
    # Lift the temporary faults once they have been hit.
    for name in ("timeout, nothing sent", "timeout after the send"):
        inst = plan[name][1]
        wait_for(lambda: len(ctx.sim.sends(instance=inst.name)) >= s.r6_per_case, timeout=60)
        ctx.sim.faults(inst.name, hang_rate=0.0)
    for name in ("Connection Closed (500)", "Connection Closed (400)"):
        inst = plan[name][1]
        wait_for(lambda: len(ctx.sim.sends(instance=inst.name)) >= s.r6_per_case, timeout=60)
        time.sleep(3)  # the socket stays down a while; nothing may be burnt meanwhile
        ctx.sim.faults(inst.name, error_rate=0.0)

    all_ids = [i for _c, _inst, ids in plan.values() for i in ids]
    state = ctx.drain(all_ids)
    groups = ctx.sends_by_text()
    rows_out: dict[str, Any] = {}
    all_ok = True
    for case, inst, ids in plan.values():
        ok, detail = _judge(case.expect, _outcome(ids), groups, case.max_sends_per_message, case.max_attempts)
        ok &= len(ids) >= s.r6_per_case
        all_ok &= ok
        rows_out[case.name] = {"ok": ok, "expected": " ".join(x for x in case.expect if x), **detail}

    # Link faults through the proxy: these touch every instance, so they run one after the other.
    if ctx.proxy is not None:
        for label, mode in LINK_CASES:
            inst = _instance(ctx, _slug(label))
            ctx.register(inst, ACKS_DELIVERED)
            ctx.proxy.set_mode(mode)  # type: ignore[arg-type]
            ids = [x.id for x in (ctx.send(recipient, f"r6 {label} #{i}", instance=inst.name)
                                  for i in range(s.r6_per_case)) if x.id]
            time.sleep(6.0)
            ctx.proxy.set_mode("pass")
            ctx.drain(ids)
            ok, detail = _judge(("OK", ""), _outcome(ids), ctx.sends_by_text(instance=inst.name), 1)
            ok &= len(ids) == s.r6_per_case
            all_ok &= ok
            rows_out[label] = {"ok": ok, "expected": "OK", **detail}
    figures = {"cases": len(rows_out), "right": sum(1 for r in rows_out.values() if r["ok"]),
               "lost": state["lost"], "matrix": rows_out}
    return {"passed": all_ok and state["lost"] == 0, "fault": FAULT, "must": MUST, "figures": figures, "notes": []}


def _global_key() -> str:
    from django.conf import settings

    return settings.EVOLUTION_API_KEY
