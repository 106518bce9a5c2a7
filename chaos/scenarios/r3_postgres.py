"""R3: Postgres stopped. The API answers 503 with the JSON error envelope (sends, reads and the
Evolution webhook alike), leaves no partial rows, and every process carries on afterwards without a
restart: the first sends after Postgres returns are accepted and delivered."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import requests
from django.db import connection

from tests.support.services import stopped

from ..context import ACKS_DELIVERED, Context
from .common import accepted_ids, pids

FAULT = "Postgres stopped {outage}s under {rate}/s sends, reads and webhooks"
MUST = "503 with the JSON error; no partial rows; recovery without a restart"


def _probe(ctx: Context, message_id: str, i: int) -> list[tuple[str, int, Any]]:
    """One send, one read and one webhook; (kind, status, error code or body excerpt) each."""
    a = ctx.world.a
    http = ctx.session()
    results = []
    sent = ctx.send(a.recipients[i % len(a.recipients)], f"r3-outage #{i}", instance=a.fleet[0].name, timeout=15)
    results.append(("send", sent.status, _code(sent.body)))
    for kind, call in (
        ("read", lambda: http.get(f"{ctx.stack.web_url}/v1/messages/{message_id}", timeout=15,
                                  headers={"Authorization": f"Bearer {a.live_key}"})),
        ("webhook", lambda: http.post(ctx.stack.webhook_url, timeout=15,
                                      headers={"x-webhook-token": a.instance.webhook_token},
                                      json={"event": "connection.update", "instance": a.instance.name,
                                            "data": {"instance": a.instance.name, "state": "open", "statusReason": 200}})),
    ):
        try:
            r = call()
            results.append((kind, r.status_code, _code(_json(r))))
        except requests.RequestException as exc:
            results.append((kind, 0, type(exc).__name__))
    return results


def _json(r: requests.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return {"raw": r.text[:80]}


def _code(body: Any) -> Any:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"].get("code")
    return str(body)[:80]


def run(ctx: Context) -> dict[str, Any]:
    from messaging.models import Message

    s = ctx.sizes
    ctx.fresh(ACKS_DELIVERED)
    warm = ctx.send_many(5, "r3-before")
    before_ids = accepted_ids(warm)
    before = pids(ctx.stack)
    outage: list[tuple[str, int, Any]] = []
    i = 0
    try:
        with stopped("postgres"):
            end = time.monotonic() + s.r3_outage_s
            while time.monotonic() < end:
                started = time.monotonic()
                outage += _probe(ctx, before_ids[0], i)
                i += 1
                time.sleep(max(0.0, 1 / s.r3_rate - (time.monotonic() - started)))
    finally:
        connection.close()  # the harness's own connection died with the server
    # Recovery, no process restarted: the first sends after the restart.
    after_sends = []
    first_ok_after_s = None
    t0 = time.monotonic()
    for j in range(10):
        sent = ctx.send(ctx.world.a.recipients[j], f"r3-after #{j}", instance=ctx.world.a.fleet[1].name)
        after_sends.append(sent)
        if sent.status == 202 and first_ok_after_s is None:
            first_ok_after_s = round(time.monotonic() - t0, 2)
        if sent.status != 202:
            time.sleep(0.5)
    after_ids = accepted_ids(after_sends)
    state = ctx.drain(before_ids + after_ids)
    # Integrity: every stored message has its ACCEPTED event; nothing accepted during the outage.
    stored_during = Message.objects.filter(text__startswith="r3-outage").count()
    partial = Message.objects.exclude(events__kind="ACCEPTED").count()
    by_kind: dict[str, Counter[str]] = {}
    for kind, status, code in outage:
        by_kind.setdefault(kind, Counter())[f"{status} {code}"] += 1
    not_503_json = sum(1 for _k, st, code in outage if not (st == 503 and code == "unavailable"))
    after = pids(ctx.stack)
    figures = {
        "calls_during_outage": len(outage),
        "answers_during_outage": {k: dict(v) for k, v in by_kind.items()},
        "answers_not_503_json": not_503_json,
        "stored_during_outage": stored_during,
        "messages_without_accepted_event": partial,
        "first_202_after_restart_s": first_ok_after_s,
        "sends_after_restart": f"{len(after_ids)}/{len(after_sends)} accepted",
        "processes_restarted": sorted(n for n in before if before[n] != after.get(n)),
        "lost": state["lost"],
        "final": state["by_status"],
    }
    passed = (bool(outage) and not_503_json == 0 and stored_during == 0 and partial == 0
              and len(after_ids) >= len(after_sends) - 1 and not figures["processes_restarted"] and state["lost"] == 0)
    notes = []
    if len(after_ids) < len(after_sends):
        notes.append("the first call(s) after the restart answered 503 (a pooled connection found dead), then 202")
    return {"passed": passed, "fault": FAULT.format(outage=s.r3_outage_s, rate=s.r3_rate), "must": MUST,
            "figures": figures, "notes": notes}
