"""S3: Evolution's webhook called without valid authentication, with a forged `already_saved`, and
internal calls replayed without the internal secret. Each is refused with 401 and nothing is stored:
the inbox does not grow and the targeted message keeps its status."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import jwt
import requests
from django.utils import timezone

from ..context import Context

FAULT = "webhooks without valid Evolution auth, forged already_saved, replayed internal calls"
MUST = "401, nothing stored"


def _target(ctx: Context) -> Any:
    from messaging.models import Message

    a = ctx.world.a
    return Message.objects.create(
        project=a.project, environment="LIVE", category="UTILITY", to=a.recipients[0], template="s3", text="s3",
        instance=a.instance, deliver_until=timezone.now() + timedelta(hours=1), status="SENT",
        sent_at=timezone.now(), evolution_message_id="3EB0C0FFEE0000000000AA",
        remote_jid=a.recipients[0].lstrip("+") + "@s.whatsapp.net")


def _event(instance: str, message: Any, **extra: Any) -> dict[str, Any]:
    body = {"event": "messages.update", "instance": instance,
            "data": {"keyId": message.evolution_message_id, "remoteJid": message.remote_jid, "fromMe": True,
                     "status": "READ"},
            "date_time": "2026-01-01T00:00:00.000Z", "server_url": "http://evolution"}
    body.update(extra)
    return body


def _jwt(key: str, **claims: Any) -> str:
    now = int(time.time())
    return jwt.encode({"iat": now, "exp": now + 600, "app": "evolution", "action": "webhook", **claims}, key,
                      algorithm="HS256")


def _cases(ctx: Context, message: Any) -> list[tuple[str, str, dict[str, str], dict[str, Any]]]:
    from django.conf import settings

    a, c = ctx.world.a.instance, ctx.world.c.instance
    url, by_event = ctx.stack.webhook_url, ctx.stack.webhook_url + "/messages-update"
    ev = _event(a.name, message)
    none_alg = jwt.encode({"iat": int(time.time()), "exp": int(time.time()) + 600}, None, algorithm="none")
    expired = _jwt(a.webhook_token, iat=int(time.time()) - 4000, exp=int(time.time()) - 3000)
    return [
        ("no credentials", url, {}, ev),
        ("no credentials, by-events path", by_event, {}, ev),
        ("wrong x-webhook-token", url, {"x-webhook-token": "0" * 64}, ev),
        ("another instance's x-webhook-token", url, {"x-webhook-token": c.webhook_token}, ev),
        ("wrong body apikey", url, {}, {**ev, "apikey": "NOT-THE-TOKEN"}),
        ("another instance's apikey", url, {}, {**ev, "apikey": f"TOKEN-{c.name}".upper()}),
        ("JWT signed with a wrong key", url, {"Authorization": f"Bearer {_jwt('not-the-key-0123456789')}"}, ev),
        ("JWT signed with another instance's key", url, {"Authorization": f"Bearer {_jwt(c.webhook_token)}"}, ev),
        ("expired JWT", url, {"Authorization": f"Bearer {expired}"}, ev),
        ("alg=none JWT", url, {"Authorization": f"Bearer {none_alg}"}, ev),
        ("unknown instance", url, {"x-webhook-token": a.webhook_token}, _event("no-such-instance", message)),
        ("forged already_saved, no secret", url, {}, {**ev, "already_saved": True}),
        ("forged already_saved with a valid instance token", url, {"x-webhook-token": a.webhook_token},
         {**ev, "already_saved": True}),
        ("forged already_saved, wrong secret", url, {"x-internal-webhook-secret": "guess"}, {**ev, "already_saved": True}),
        ("replayed internal forward, secret stripped", url, {},
         {**ev, "already_saved": True, "apikey": f"TOKEN-{a.name}".upper()}),
        ("replayed internal forward, secret of another deployment", url,
         {"x-internal-webhook-secret": settings.INTERNAL_WEBHOOK_SECRET[::-1]}, {**ev, "already_saved": True}),
    ]


def run(ctx: Context) -> dict[str, Any]:
    from ingestion.models import IngestionEvent
    from messaging.models import Message

    ctx.fresh()
    message = _target(ctx)
    inbox_before = IngestionEvent.objects.count()
    rows = []
    http = requests.Session()
    for label, url, headers, body in _cases(ctx, message):
        r = http.post(url, json=body, headers=headers, timeout=15)
        rows.append({"call": label, "status": r.status_code, "ok": r.status_code == 401})
    for label, path in (("metrics without the secret", "/api/internal/metrics"),
                        ("prometheus metrics without the secret", "/api/internal/metrics/prometheus")):
        r = http.get(ctx.stack.web_url + path, timeout=15)
        rows.append({"call": label, "status": r.status_code, "ok": r.status_code == 401})
    stored = IngestionEvent.objects.count() - inbox_before
    status_after = Message.objects.get(pk=message.pk).status
    bad = [r for r in rows if not r["ok"]]
    figures = {"calls": len(rows), "answered_401": len(rows) - len(bad),
               "unexpected": [f"{r['call']} → {r['status']}" for r in bad],
               "inbox_rows_added": stored, "target_status_after": status_after}
    passed = not bad and stored == 0 and status_after == "SENT"
    return {"passed": passed, "fault": FAULT, "must": MUST, "figures": figures, "notes": [], "calls": rows}
