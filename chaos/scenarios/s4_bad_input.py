"""S4: malformed JSON, huge bodies, wrong content types, odd Unicode and every phone format, with a
valid key. Each bad request gets a clear 4xx JSON error (`{"error": {"code", "message", ...}}`) and
stores nothing; a phone format that is valid may be accepted, and then it is stored in E.164."""

from __future__ import annotations

import json
import re
from typing import Any

import requests

from ..context import Context

FAULT = "malformed JSON, huge bodies, wrong content types, odd Unicode, every phone format"
MUST = "a clear 4xx JSON error each, nothing stored"
E164 = re.compile(r"^\+[1-9][0-9]{7,14}$")

# (label, body) sent as-is with Content-Type: application/json
MALFORMED = [
    ("truncated JSON", b'{"to": "+5511960000000", "category": "UTILITY", "text": "hi"'),
    ("not JSON at all", b"to=+5511960000000&text=hi"),
    ("JSON array", b"[]"),
    ("JSON null", b"null"),
    ("JSON string", b'"hello"'),
    ("trailing garbage", b'{"to": "+5511960000000", "category": "UTILITY", "text": "hi"} x'),
    ("NaN literal", b'{"to": "+5511960000000", "category": "UTILITY", "text": NaN}'),
    ("deeply nested (50k)", b'{"to": "+5511960000000", "category": "UTILITY", "text": "hi", "metadata": '
     + b"[" * 50_000 + b"]" * 50_000 + b"}"),
    ("invalid UTF-8", b'{"to": "+5511960000000", "category": "UTILITY", "text": "\xff\xfe"}'),
    ("UTF-16 body", json.dumps({"to": "+5511960000000", "category": "UTILITY", "text": "hi"}).encode("utf-16")),
    ("empty body", b""),
]


def _send_body(to: Any = "+5511960000000", **extra: Any) -> dict[str, Any]:
    return {"to": to, "category": "UTILITY", "text": "hello", **extra}


# (label, JSON body) with fields of the wrong type or odd Unicode
ODD = [
    ("to as a number", _send_body(5511960000000)),
    ("to as null", _send_body(None)),
    ("to as a list", _send_body(["+5511960000000"])),
    ("text as an object", {**_send_body(), "text": {"a": 1}}),
    ("unknown category", {**_send_body(), "category": "SPAM"}),
    ("variables not an object", _send_body(variables=["x"])),
    ("NUL in text", {**_send_body(), "text": "hel\u0000lo"}),
    ("NUL in a variable", _send_body(text="code {{c}}", variables={"c": "1\u00002"})),
    ("NUL in metadata", _send_body(metadata={"k": "a\u0000b"})),
    ("NUL in a metadata key", _send_body(metadata={"a\u0000": "b"})),
    ("lone surrogate in text", {**_send_body(), "text": "\ud800"}),
    ("lone surrogate in metadata", _send_body(metadata={"k": "\udfff"})),
    ("Idempotency-Key of 1,000 characters", _send_body()),  # header set below
    ("deliverUntil not a date", _send_body(deliverUntil="tomorrow")),
    ("deliverUntil year 99999", _send_body(deliverUntil="99999-01-01T00:00:00Z")),
    ("deliverUntil in the past", _send_body(deliverUntil="2001-01-01T00:00:00Z")),
    ("priority unknown", _send_body(priority="asap")),
    ("instance name with NUL", _send_body(instance="chaos-a\u0000")),
    ("text 100k characters", {**_send_body(), "text": "x" * 100_000}),
    ("metadata 10k keys", _send_body(metadata={str(i): i for i in range(10_000)})),
    ("variables 10k entries", _send_body(text="{{a}}", variables={f"v{i}": "x" for i in range(10_000)})),
]

# Odd but valid text: accepted (202) is right for these.
VALID_TEXT = [
    ("emoji and ZWJ sequences", "👩‍👩‍👧‍👦 🇧🇷 ok"),
    ("right-to-left override", "abc\u202edcba"),
    ("combining marks", "Z̷̢͈a̸̡l̴g̵o̶"),
    ("zero-width characters", "a\u200b\u200c\u200db\ufeff"),
]

PHONES_INVALID = ["", " ", "+", "+0", "+123", "+1234567", "+" + "9" * 16, "abc", "+55abc11960000000",
                  "tel:+5511960000000", "+55 11 96000 0000 ext 12", "+5511960000000x12", "+551196000000\u0000",
                  "+55 ¹¹ 960000000", "0", "-5511960000000", "+55-11-9600-0000-0000-0000", "5511960000000",
                  "005511960000000", "+55 11 96000-0000 / +55 11 96000-0001"]
# Forms of +5511960000000 a client may send: accepted only if stored exactly as that E.164 number.
PHONES_MAYBE = ["+55 11 96000-0000", "+55 (11) 96000-0000", "+55.11.96000.0000", " +5511960000000 ",
                "+5511960000000", "++5511960000000", "+55\n11960000000", "+٥٥١١٩٦٠٠٠٠٠٠٠", "+５５１１９６０００００００"]
INTENDED = "+5511960000000"


def _is_clear_error(r: requests.Response) -> bool:
    if not (400 <= r.status_code < 500):
        return False
    try:
        err = r.json()["error"]
        return isinstance(err["code"], str) and bool(err["code"]) and isinstance(err["message"], str)
    except Exception:
        return False


def run(ctx: Context) -> dict[str, Any]:
    from messaging.models import Message, OptIn

    ctx.fresh()
    a = ctx.world.a
    from messaging import opt_ins

    for p in ("+5511960000000",):
        opt_ins.record(a.project, p, "s4")
    base = ctx.stack.web_url
    auth = {"Authorization": f"Bearer {a.live_key}"}
    http = requests.Session()
    rows: list[dict[str, Any]] = []

    def call(label: str, method: str, path: str, *, data: bytes | None = None, body: Any = None,
             headers: dict[str, str] | None = None, may_accept: bool = False) -> None:
        before_messages, before_optins = Message.objects.count(), OptIn.objects.count()
        h = {**auth, **(headers or {})}
        if body is not None:
            data = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
        try:
            r = http.request(method, base + path, data=data, headers=h, timeout=30)
            status, clear = r.status_code, _is_clear_error(r)
            code = r.json()["error"]["code"] if clear else (r.text[:60] if r.status_code >= 400 else "")
        except requests.RequestException as exc:
            status, clear, code = 0, False, type(exc).__name__
        stored = (Message.objects.count() - before_messages) + (OptIn.objects.count() - before_optins)
        if may_accept and status in (201, 202):
            new = Message.objects.order_by("-created_at").values_list("to", flat=True).first() if status == 202 else None
            ok = new is None or (bool(E164.match(new)) and ("to=" not in label or new == INTENDED))
            code = f"accepted as {new}" if new else "accepted"
        else:
            ok = clear and stored == 0
        rows.append({"call": label, "status": status, "code": code, "stored": stored, "ok": ok})

    for label, raw in MALFORMED:
        call(f"send: {label}", "POST", "/v1/messages/send", data=raw)
    for label, body in ODD:
        headers = {"Idempotency-Key": "k" * 1000} if "Idempotency" in label else None
        call(f"send: {label}", "POST", "/v1/messages/send", body=body, headers=headers)
    for label, text in VALID_TEXT:
        call(f"send: {label} (valid)", "POST", "/v1/messages/send", body={**_send_body(), "text": text}, may_accept=True)
    good = json.dumps(_send_body()).encode()
    for label, ctype in (("text/plain", "text/plain"), ("form", "application/x-www-form-urlencoded"),
                         ("multipart", "multipart/form-data; boundary=x"), ("XML", "application/xml"),
                         ("no content type", "")):
        call(f"send: content type {label}", "POST", "/v1/messages/send", data=good, headers={"Content-Type": ctype})
    call("send: 1 MB body", "POST", "/v1/messages/send", body={**_send_body(), "text": "x" * 1_000_000})
    call("send: 70 kB body", "POST", "/v1/messages/send", body={**_send_body(), "metadata": {"k": "y" * 70_000}})
    for phone in PHONES_INVALID:
        call(f"send: to={phone!r}", "POST", "/v1/messages/send", body=_send_body(phone))
        call(f"opt-in: phone={phone!r}", "POST", "/v1/opt-ins", body={"phone": phone, "source": "s4"})
    for phone in PHONES_MAYBE:
        call(f"send: to={phone!r} (valid form)", "POST", "/v1/messages/send", body=_send_body(phone), may_accept=True)
        call(f"opt-in: phone={phone!r} (valid form)", "POST", "/v1/opt-ins", body={"phone": phone, "source": "s4"},
             may_accept=True)
    call("read: id not a UUID", "GET", "/v1/messages/not-a-uuid")
    call("list: garbage cursor", "GET", "/v1/messages?cursor=%00%ff garbage")
    call("list: unknown status", "GET", "/v1/messages?status=NOPE")
    call("opt-out: odd phone", "DELETE", "/v1/opt-ins/%F0%9F%98%80")
    webhook_auth = {"x-webhook-token": a.instance.webhook_token}
    call("webhook: truncated JSON", "POST", "/api/internal/webhook", data=b'{"event": "messages.update"',
         headers=webhook_auth)
    from django.conf import settings

    # Over the event bound (a media message's caption and thumbnail fit under it): 413, never stored.
    call("webhook: body over EVOLUTION_EVENT_MAX_BYTES", "POST", "/api/internal/webhook", headers=webhook_auth,
         body={"event": "messages.update", "instance": a.instance.name,
               "data": {"x": "y" * (settings.EVOLUTION_EVENT_MAX_BYTES + 1)}})
    rows.append(_nul_webhook(ctx, webhook_auth))
    call("webhook: not an event", "POST", "/api/internal/webhook", headers=webhook_auth, body={"hello": "world"})

    rows.append(_poison_on_rabbitmq(ctx))
    bad = [r for r in rows if not r["ok"]]
    server_errors = [r for r in rows if r["status"] >= 500 or (r["status"] == 0 and "RabbitMQ" not in r["call"])]
    figures = {"calls": len(rows), "as_expected": len(rows) - len(bad), "server_errors": len(server_errors),
               "unexpected": [f"{r['call']} → {r['status']} {r['code']!s:.60} (stored {r['stored']})" for r in bad]}
    return {"passed": not bad, "fault": FAULT, "must": MUST, "figures": figures, "notes": [], "calls": rows}


def _poison_on_rabbitmq(ctx: Context) -> dict[str, Any]:
    """Evolution publishes an event holding a NUL (user text can); the consumer must survive it and
    keep ingesting: a later, ordinary event still arrives through RabbitMQ."""
    import time

    from ingestion.models import IngestionEvent

    from ..context import wait_for

    inst = ctx.world.a.instance
    consumer = ctx.stack.processes["consumer"]
    pid = consumer.proc.pid if consumer.alive() else None
    ctx.sim.instance(inst.name, webhook={"enabled": False})  # RabbitMQ only
    try:
        ctx.sim.emit(inst.name, "messages.update", {"keyId": "3EB0NUL\u0000", "remoteJid": "5511960000000@s.whatsapp.net",
                                                    "fromMe": True, "status": "READ"})
        time.sleep(2)
        marker = f"3EB0AFTER{int(time.time() * 1000)}"
        ctx.sim.emit(inst.name, "messages.update", {"keyId": marker, "remoteJid": "5511960000000@s.whatsapp.net",
                                                    "fromMe": True, "status": "READ"})
        arrived, _ = wait_for(lambda: IngestionEvent.objects.filter(channel="RABBITMQ", key_id=marker).exists(), timeout=30)
        # The NUL event itself is stored too (the inbox replaces the NUL), not parked.
        poison_stored = IngestionEvent.objects.filter(key_id__startswith="3EB0NUL", channel="RABBITMQ").exists()
    finally:
        ctx.sim.instance(inst.name, webhook={"enabled": True})
    same = consumer.alive() and consumer.proc.pid == pid and ctx.stack.processes["consumer"] is consumer
    ok = same and arrived and poison_stored
    return {"call": "RabbitMQ: event with a NUL, then an ordinary one", "status": 200 if ok else 0,
            "code": f"consumer alive: {same}; NUL event stored: {poison_stored}; next event ingested: {arrived}",
            "stored": 0, "ok": ok}


def _nul_webhook(ctx: Context, headers: dict[str, str]) -> dict[str, Any]:
    """A genuine event whose content holds a NUL (user text can): not bad input, it must be stored
    (the inbox replaces the NUL), not refused for ever with a retryable 503."""
    from ingestion.models import IngestionEvent

    a = ctx.world.a.instance
    # Counted by this event's own key: receipts of the messages the send cases above accepted may
    # still be arriving for the same instance (the receipts run at the background priority).
    own = IngestionEvent.objects.filter(instance_name=a.name, key_id__startswith="3EB0NULWEBHOOK")
    before = own.count()
    r = requests.post(ctx.stack.webhook_url, headers=headers, timeout=30,
                      json={"event": "messages.update", "instance": a.name,
                            "data": {"keyId": "3EB0NULWEBHOOK\u0000", "status": "READ"}})
    stored = own.count() - before
    return {"call": "webhook: genuine event with a NUL in data (must be stored)", "status": r.status_code,
            "code": f"inbox rows added: {stored}", "stored": stored, "ok": r.status_code == 200 and stored == 1}
