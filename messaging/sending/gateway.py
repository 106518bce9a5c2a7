"""The one module that talks to Evolution API, and the one function that classifies its answers.

Every answer of the real API (docs/evolution-setup.md, "Error answers") maps to exactly one Outcome kind:
sent, permanent (with a FailureReason), transient, disconnected, misconfigured, or unknown
(the request may have reached Evolution but no answer came back: check before resending).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import requests
from django.conf import settings

from pilot_status import observe

from ..models import FailureReason
from . import budget

SENT = "sent"
PERMANENT = "permanent"
TRANSIENT = "transient"
DISCONNECTED = "disconnected"
MISCONFIGURED = "misconfigured"
UNKNOWN = "unknown"

_BODY_LIMIT = 2000


@dataclass(frozen=True)
class Outcome:
    kind: str
    status_code: int | None = None
    reason: str | None = None  # a FailureReason for permanent outcomes
    message_id: str = ""
    remote_jid: str = ""
    detail: str = ""
    body: Any = None
    elapsed_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def permanent(self) -> bool:
        return self.kind == PERMANENT

    def as_record(self) -> dict[str, Any]:
        """What the timeline and the dead letter keep of this answer."""
        return {
            "outcome": self.kind,
            "httpStatus": self.status_code,
            "reason": self.reason,
            "detail": self.detail,
            "body": self.body,
            "elapsedMs": self.elapsed_ms,
        }


def _messages(body: Any) -> list[Any]:
    if isinstance(body, dict):
        response = body.get("response")
        if isinstance(response, dict):
            message = response.get("message")
            if isinstance(message, list):
                return message
            if message is not None:
                return [message]
    return []


def _mentions_connection_closed(items: list[Any]) -> bool:
    return any(isinstance(item, str) and "Connection Closed" in item for item in items)


def classify(status_code: int, body: Any) -> Outcome:
    """Map one HTTP answer of POST /message/sendText to an Outcome (pure: tested on real bodies)."""
    short = _truncate(body)
    messages = _messages(body)
    if status_code in (200, 201) and isinstance(body, dict) and isinstance(body.get("key"), dict):
        key = body["key"]
        return Outcome(
            SENT,
            status_code,
            message_id=str(key.get("id", "")),
            remote_jid=str(key.get("remoteJid", "")),
            body=short,
        )
    if status_code == 404:
        if any(isinstance(m, str) and m.startswith("Cannot ") for m in messages):
            # Wrong route: a deployment/config fault on our side, not the instance's.
            return Outcome(MISCONFIGURED, status_code, detail="Evolution route not found", body=short)
        return Outcome(
            PERMANENT,
            status_code,
            reason=FailureReason.INSTANCE_NOT_FOUND,
            detail="Evolution says the instance does not exist",
            body=short,
        )
    if status_code == 401:
        return Outcome(MISCONFIGURED, status_code, detail="Evolution refused our apikey", body=short)
    if _mentions_connection_closed(messages):
        # 500 "Connection Closed" or the cached variant 400 ["Error: Connection Closed"].
        return Outcome(DISCONNECTED, status_code, detail="instance connection closed", body=short)
    if status_code == 500 and any(
        isinstance(m, str) and "reading 'textMessage'" in m or isinstance(m, str) and "reading 'onWhatsApp'" in m
        for m in messages
    ):
        # Instance known to Evolution's DB but not loaded / never connected: waiting helps.
        return Outcome(DISCONNECTED, status_code, detail="instance not loaded on Evolution", body=short)
    if status_code == 400:
        for item in messages:
            if isinstance(item, dict) and item.get("exists") is False:
                return Outcome(
                    PERMANENT,
                    status_code,
                    reason=FailureReason.INVALID_RECIPIENT,
                    detail=f"{item.get('number') or item.get('jid')} is not on WhatsApp",
                    body=short,
                )
        return Outcome(
            PERMANENT,
            status_code,
            reason=FailureReason.REJECTED,
            detail=f"Evolution rejected the request: {short}",
            body=short,
        )
    if status_code in (408, 429) or status_code >= 500:
        return Outcome(TRANSIENT, status_code, detail=f"HTTP {status_code}", body=short)
    if 400 <= status_code < 500:
        return Outcome(
            PERMANENT, status_code, reason=FailureReason.REJECTED, detail=f"HTTP {status_code}", body=short
        )
    return Outcome(TRANSIENT, status_code, detail=f"unexpected HTTP {status_code}", body=short)


def _truncate(body: Any) -> Any:
    text = body if isinstance(body, str) else None
    if text is not None and len(text) > _BODY_LIMIT:
        return text[:_BODY_LIMIT] + "…"
    return body


def digits(phone: str) -> str:
    return "".join(ch for ch in phone if ch.isdigit())


_local = threading.local()


def _session() -> requests.Session:
    # One pooled session per thread: keep-alive to Evolution matters at thousands of sends/s.
    session = getattr(_local, "session", None)
    if session is None:
        session = requests.Session()
        session.headers.update({"apikey": settings.EVOLUTION_API_KEY, "Content-Type": "application/json"})
        # Not from the environment: re-reading proxy and CA variables on every request was a tenth
        # of a lane worker's CPU (bench B2 profile). EVOLUTION_API_URL is reached directly.
        session.trust_env = False
        _local.session = session
    return session


def _timeout(read: float | None = None) -> tuple[float, float]:
    return (settings.EVOLUTION_CONNECT_TIMEOUT, read or settings.EVOLUTION_READ_TIMEOUT)


def _parse(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:_BODY_LIMIT]


def send_text(instance: str, to: str, text: str, delay_ms: int = 0, message_id: str = "") -> Outcome:
    started = time.perf_counter()
    outcome = _send_text(instance, to, text, delay_ms, message_id)
    observe.observe(observe.GATEWAY_CALL, outcome.kind, time.perf_counter() - started)
    return outcome


def _send_text(instance: str, to: str, text: str, delay_ms: int, message_id: str) -> Outcome:
    url = f"{settings.EVOLUTION_API_URL}/message/sendText/{instance}"
    payload: dict[str, Any] = {"number": digits(to), "text": text, "linkPreview": False}
    if message_id:
        # The WhatsApp id to send with (sending.own_id); an Evolution older than the field ignores it.
        payload["messageId"] = message_id
    if delay_ms:
        payload["delay"] = delay_ms
    # The typing delay blocks the request on Evolution's side: allow for it in the read timeout.
    read_timeout = settings.EVOLUTION_READ_TIMEOUT + delay_ms / 1000
    try:
        response = _session().post(url, json=payload, timeout=_timeout(read_timeout))
    except requests.ConnectTimeout as exc:
        return Outcome(TRANSIENT, detail=f"connect timeout: {exc.__class__.__name__}")
    except requests.ConnectionError as exc:
        if isinstance(exc, requests.ReadTimeout):  # pragma: no cover - ReadTimeout is a Timeout
            return Outcome(UNKNOWN, detail="read timeout")
        # Refused or reset before an answer. A reset after the body was sent may hide a send:
        # treat it as unknown so the next attempt checks Evolution first.
        text = str(exc)
        kind = TRANSIENT if "refused" in text.lower() or "Failed to establish" in text else UNKNOWN
        return Outcome(kind, detail=f"connection error: {text[:300]}")
    except requests.Timeout:
        return Outcome(UNKNOWN, detail="read timeout: Evolution may have sent the message")
    outcome = classify(response.status_code, _parse(response))
    return Outcome(**{**outcome.__dict__, "elapsed_ms": int(response.elapsed.total_seconds() * 1000)})


# What connection_state answers for an instance Evolution does not have (404): deleted, or never created.
MISSING = "missing"


def connection_state(instance: str) -> str | None:
    """open / connecting / close, "missing" for an unknown instance, or None when Evolution is unreachable."""
    url = f"{settings.EVOLUTION_API_URL}/instance/connectionState/{instance}"
    try:
        response = _session().get(url, timeout=_timeout(budget.CHECK_READ_TIMEOUT))
    except requests.RequestException:
        return None
    if response.status_code == 404:
        return MISSING
    if response.status_code != 200:
        return None
    body = _parse(response)
    if isinstance(body, dict) and isinstance(body.get("instance"), dict):
        return body["instance"].get("state") or "close"
    return None


def find_status_messages(instance: str, key_id: str) -> list[dict[str, Any]] | None:
    """Every status row Evolution recorded for one message, or None when it cannot tell."""
    url = f"{settings.EVOLUTION_API_URL}/chat/findStatusMessage/{instance}"
    try:
        response = _session().post(
            url, json={"where": {"id": key_id}, "page": 1, "offset": 50}, timeout=_timeout(5.0)
        )
    except requests.RequestException:
        return None
    if response.status_code not in (200, 201):
        return None
    body = _parse(response)
    if isinstance(body, list):
        return [row for row in body if isinstance(row, dict)]
    if isinstance(body, dict) and isinstance(body.get("records"), list):
        return [row for row in body["records"] if isinstance(row, dict)]
    return None


class CannotTell(Exception):
    """Evolution could not be asked (down, timeout, odd answer)."""


def recipient_jids(instance: str, to: str) -> list[str]:
    """Every jid Evolution may file a chat with `to` under: the one WhatsApp confirms (Brazil's 9th
    digit), the plain digits one, and the contact's LID (`…@lid`) when whatsappNumbers gives one.
    Raises CannotTell when Evolution cannot be asked: a LID chat could then be missed."""
    plain = f"{digits(to)}@s.whatsapp.net"
    url = f"{settings.EVOLUTION_API_URL}/chat/whatsappNumbers/{instance}"
    try:
        response = _session().post(url, json={"numbers": [digits(to)]}, timeout=_timeout(budget.CHECK_READ_TIMEOUT))
    except requests.RequestException as exc:
        raise CannotTell(f"whatsappNumbers: {exc}") from exc
    if response.status_code not in (200, 201):
        raise CannotTell(f"whatsappNumbers: HTTP {response.status_code}")
    body = _parse(response)
    jids = [plain]
    for entry in body if isinstance(body, list) else []:
        if not isinstance(entry, dict):
            continue
        for name in ("jid", "lid"):
            value = entry.get(name)
            if isinstance(value, str) and value:
                jid = value if "@" in value else f"{value}@{'lid' if name == 'lid' else 's.whatsapp.net'}"
                if jid not in jids:
                    jids.append(jid)
    return jids[: budget.CHECK_JIDS]


def find_by_id(instance: str, key_id: str) -> list[dict[str, Any]]:
    """Our outgoing records with WhatsApp id `key_id` (findMessages where key.id), whatever their text and chat:
    none when Evolution has no such message. Raises CannotTell when Evolution could not be asked."""
    records, _ = _find_messages(instance, {"where": {"key": {"id": key_id}}, "page": 1, "offset": 10})
    return [
        record for record in records
        if isinstance(record, dict) and isinstance(record.get("key"), dict)
        and record["key"].get("id") == key_id and record["key"].get("fromMe") is True
    ]


def _find_messages(instance: str, query: dict[str, Any]) -> tuple[list[Any], int | None]:
    """One page of Evolution's findMessages for `query`: its records and the total it reports (None if it reports
    none). Raises CannotTell when Evolution could not be asked or gave no list of records."""
    url = f"{settings.EVOLUTION_API_URL}/chat/findMessages/{instance}"
    try:
        response = _session().post(url, json=query, timeout=_timeout(budget.CHECK_READ_TIMEOUT))
    except requests.RequestException as exc:
        raise CannotTell(f"findMessages: {exc}") from exc
    if response.status_code not in (200, 201):
        raise CannotTell(f"findMessages: HTTP {response.status_code}")
    body = _parse(response)
    page = (body.get("messages") if isinstance(body, dict) else None) or {}
    records = page.get("records") if isinstance(page, dict) else None
    if not isinstance(records, list):
        raise CannotTell("findMessages: no records in the answer")
    total = page.get("total")
    return records, total if isinstance(total, int) else None


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_text(record: dict[str, Any]) -> str | None:
    message = record.get("message") or {}
    if not isinstance(message, dict):
        return None
    text = message.get("conversation") or (message.get("extendedTextMessage") or {}).get("text")
    return text if isinstance(text, str) else None


def find_sent_candidates(instance: str, to: str, text: str, since_epoch: float, until_epoch: float) -> list[dict[str, Any]]:
    """Our outgoing records to `to` (under any of its jids) with this text, stamped inside
    [since, until] (whole seconds, as Evolution stamps them): the sends a lost answer may have been.

    Returns them (possibly none); raises CannotTell when Evolution could not be asked or answered
    more than one page (a record could hide on the next one)."""
    since, until = math.floor(since_epoch), math.ceil(until_epoch)
    found: dict[str, dict[str, Any]] = {}
    jids = recipient_jids(instance, to)
    for jid in jids:
        query = {
            "where": {
                "key": {"remoteJid": jid, "fromMe": True},
                "messageTimestamp": {"gte": _iso(since), "lte": _iso(until)},
            },
            "page": 1,
            "offset": 50,
        }
        records, total = _find_messages(instance, query)
        if total is not None and total > len(records):
            raise CannotTell(f"findMessages: {total} records in the window, more than one page")
        for record in records:
            if not isinstance(record, dict):
                continue
            key: dict[str, Any] = record["key"] if isinstance(record.get("key"), dict) else {}
            stamp = record.get("messageTimestamp")
            stamp = stamp if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else -1
            if (
                record_text(record) == text
                and key.get("fromMe") is True
                and isinstance(key.get("id"), str) and key["id"]
                and (key.get("remoteJid") in jids or key.get("remoteJidAlt") in jids)
                and since <= stamp <= until
            ):
                found[key["id"]] = record
    return list(found.values())
