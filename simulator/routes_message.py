"""sendText and the chat routes (sendMessage.router.ts, chat.router.ts)."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import datetime
from typing import Any

from aiohttp import web

from . import errors, ids, jsonbody, schemas, shapes
from .errors import Halt
from .guards import halts, instance_route
from .keys import WHATSAPP, WORLD
from .state import Instance, StoredMessage


@halts
async def send_text(request: web.Request) -> web.StreamResponse:
    # allows POST /message/sendText/{instance}
    world = request.app[WORLD]
    record: dict[str, Any] = {"instance": request.match_info["instance"], "number": None, "text": None,
                              "delay": None, "at": time.time(), "status": None, "id": None,
                              # True once the message reached WhatsApp (whatever the caller hears).
                              "reached": False, "answer_lost": None,
                              # How long this handler took, ms: against the latency and delay it was
                              # asked for, what the simulator's own event loop added (bench B8).
                              "served_ms": None,
                              # The messageId asked for; whether that id was used before on this number;
                              # what WhatsApp made of the message (accepted, 463, unacknowledged).
                              "message_id": None, "id_reused": None, "wa_outcome": None}
    world.sends.append(record)
    started = time.monotonic()
    stats = world.stats  # a reset meanwhile swaps world.stats: finish on the object this call started on
    stats.send_started()
    try:
        response = await _send_text(request, record)
    except Halt as halt:
        response = halt.response
    finally:
        stats.send_finished()
        record["served_ms"] = round((time.monotonic() - started) * 1000, 1)
    record["status"] = response.status
    world.stats.count_send(response.status)
    inst = world.instances.get(record["instance"])
    if inst is not None:
        inst.send_total += 1
        key = str(response.status)
        inst.send_by_status[key] = inst.send_by_status.get(key, 0) + 1
    return response


async def _send_text(request: web.Request, record: dict[str, Any]) -> web.StreamResponse:
    body = await jsonbody.read(request)
    if isinstance(body, dict):  # logged even when a guard rejects the request
        record["number"], record["text"], record["delay"] = body.get("number"), body.get("text"), body.get("delay")
        record["message_id"] = body.get("messageId")
    _, inst, _ = await instance_route(request, body=False)
    # In flight on this number from here (the ban model's "parallel" rule counts them), until answered.
    inst.in_flight += 1
    inst.max_in_flight = max(inst.max_in_flight, inst.in_flight)
    try:
        return await _send_on(request, record, inst, body)
    finally:
        inst.in_flight -= 1


async def _send_on(request: web.Request, record: dict[str, Any], inst: Instance, body: Any) -> web.StreamResponse:
    problems = schemas.validate(schemas.TEXT_MESSAGE, body)
    if problems:
        return errors.validation_failed(problems)
    faults = inst.faults
    injected = faults.injected_error()
    if injected is not None:
        return errors.reply(injected, faults.error_response_body(injected))
    lost = faults.lost_answer()
    record["answer_lost"] = lost
    if lost == "before":
        await asyncio.sleep(faults.hang_ms / 1000)
        return errors.reply(faults.error_status, faults.error_response_body(faults.error_status))
    hang = faults.hangs() or lost == "after"
    if hang and not faults.hang_after_send and lost is None:
        # The gateway swallows the request: nothing is sent, the answer comes (too) late.
        await asyncio.sleep(faults.hang_ms / 1000)
        return errors.reply(faults.error_status, faults.error_response_body(faults.error_status))
    if not inst.loaded:
        return errors.not_loaded("textMessage")
    text: str = body["text"]
    if not text.strip():
        return errors.bad_request("Text is required")
    _check_connected(inst)
    whatsapp = request.app[WHATSAPP]
    jid, exists = whatsapp.lookup(inst, body["number"])
    if not exists:
        return errors.bad_request({"jid": jid, "exists": False, "number": body["number"]})
    delay = body.get("delay")
    if delay and delay > 0:
        # Evolution sends "composing", sleeps, sends "paused": the HTTP answer waits for it.
        await asyncio.sleep(delay / 1000)
        if inst.state != "open" or inst.deleted:
            # The socket died while "typing": caught inside sendMessageWithTyping's try.
            return errors.bad_request("Error: Connection Closed")
    if faults.send_latency_ms:
        await asyncio.sleep(faults.send_latency_ms / 1000)  # WhatsApp taking the message
    sent = whatsapp.send_text(inst, jid, text, body.get("messageId"))
    record["id"] = sent.msg.response["key"]["id"]
    record["reached"] = True
    record["id_reused"], record["wa_outcome"] = sent.id_reused, sent.outcome
    response = errors.reply(201, sent.msg.response)
    if hang:
        await asyncio.sleep(faults.hang_ms / 1000)  # sent, events flowing, answer stuck
    return response


def _check_connected(inst: Instance) -> None:
    if inst.state == "open":
        return
    if inst.faults.number_cached:
        # The number's existence is cached, so Baileys' error is caught inside the try.
        raise Halt(errors.bad_request("Error: Connection Closed"))
    # Otherwise the Boom escapes whatsappNumber() and reaches the generic handler.
    raise Halt(errors.js_error("Connection Closed"))


@halts
async def send_presence(request: web.Request) -> web.StreamResponse:
    # allows POST /chat/sendPresence/{instance}
    _, inst, body = await instance_route(request)
    problems = schemas.validate(schemas.PRESENCE, body)
    if problems:
        return errors.validation_failed(problems)
    if not inst.loaded:
        return errors.not_loaded("sendPresence")
    # sendPresence wraps everything in try/catch -> BadRequestException(error.toString()).
    if inst.state != "open":
        return errors.bad_request("Error: Connection Closed")
    _, exists = request.app[WHATSAPP].lookup(inst, body["number"])
    if not exists:
        return errors.bad_request("[object Object]")  # a thrown plain object, stringified
    if body["delay"] > 0:
        await asyncio.sleep(body["delay"] / 1000)
    return errors.reply(201, {"presence": body["presence"]})


# Baileys' Boom for a closed socket, as JSON.stringify renders it (only own enumerable props).
_BOOM_CONNECTION_CLOSED = {
    "data": None,
    "isBoom": True,
    "isServer": False,
    "output": {
        "statusCode": 428,
        "payload": {"statusCode": 428, "error": "Precondition Required", "message": "Connection Closed"},
        "headers": {},
    },
}


@halts
async def whatsapp_numbers(request: web.Request) -> web.StreamResponse:
    # allows POST /chat/whatsappNumbers/{instance}
    _, inst, body = await instance_route(request)
    # This route catches its own errors and answers 400 with the raw error object:
    # {status, error, message} with no "response" wrapper.
    problems = schemas.validate(schemas.WHATSAPP_NUMBERS, body)
    if problems:
        return errors.reply(400, {"status": 400, "error": "Bad Request", "message": [problems]})
    if not inst.loaded:
        return errors.reply(400, {})  # a TypeError has no enumerable properties
    if inst.state != "open":
        return errors.reply(400, _BOOM_CONNECTION_CLOSED)
    whatsapp = request.app[WHATSAPP]
    result = []
    for number in body.get("numbers") or []:
        jid, exists = whatsapp.lookup(inst, number)
        entry: dict[str, Any] = {"jid": jid, "exists": exists, "number": number}
        lid = whatsapp.lid_of(inst, jid) if exists else None
        if lid:
            entry["lid"] = lid  # OnWhatsAppDto's optional lid, given when WhatsApp knows one
        result.append(entry)
    return errors.reply(200, result)


def _page(body: dict[str, Any]) -> tuple[int, int]:
    """(page size, page): `offset` is the page size in Evolution's queries; defaults 50 and 1."""
    offset, page = body.get("offset"), body.get("page")
    return (offset if isinstance(offset, int) and offset > 0 else 50,
            page if isinstance(page, int) and page > 0 else 1)


@halts
async def generate_message_id(request: web.Request) -> web.StreamResponse:
    # allows GET /baileys/generateMessageID/{instance}
    world = request.app[WORLD]
    inst = world.live(request.match_info["instance"])
    if inst is not None and inst.ignore_message_id:
        # An Evolution older than messageId has no such route either.
        await jsonbody.read(request)
        return errors.not_found(f"Cannot {request.method.upper()} {request.raw_path}")
    _, inst, _ = await instance_route(request)
    if not inst.loaded:
        return errors.not_loaded("generateMessageID")
    return errors.reply(200, {"id": ids.message_id()})  # Baileys generateMessageIDV2: 3EB0 + 18 hex


@halts
async def find_status_message(request: web.Request) -> web.StreamResponse:
    # allows POST /chat/findStatusMessage/{instance}
    _, inst, body = await instance_route(request)
    problems = schemas.validate(schemas.MESSAGE_UP, body)
    if problems:
        return errors.validation_failed(problems)
    if not inst.loaded:
        return errors.not_loaded("fetchStatusMessage")
    where = body.get("where") or {}
    key_id, remote_jid = where.get("id"), where.get("remoteJid")
    if key_id is not None:  # MessageUpdate.keyId = id: every row of every message with that id
        rows = [row for m in inst.indexed(key_id) for row in m.updates]
    else:
        rows = [row for m in inst.messages.values() for row in m.updates]
    if remote_jid is not None:
        rows = [row for row in rows if row["remoteJid"] == remote_jid]  # exact match, no normalising
    offset, page = _page(body)
    start = offset * (page - 1)
    return errors.reply(200, rows[start:start + offset])


def _epoch(value: Any) -> int | None:
    try:
        return int(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def _matches(msg: StoredMessage, where: dict[str, Any]) -> bool:
    r = msg.response
    key: dict[str, Any] = where["key"] if isinstance(where.get("key"), dict) else {}
    # fetchMessages adds a key condition only for a truthy value: `fromMe: false` filters nothing.
    for field in ("id", "fromMe", "participant"):
        if key.get(field) and key[field] != r["key"].get(field):
            return False
    # remoteJid OR remoteJidAlt, each compared with the same field of the stored key, exactly.
    jids = [(f, key[f]) for f in ("remoteJid", "remoteJidAlt") if key.get(f)]
    if jids and not any(r["key"].get(f) == value for f, value in jids):
        return False
    if "id" in where and where["id"] != msg.row_id:
        return False
    for field in ("messageType", "source"):
        if field in where and where[field] != r[field]:
            return False
    stamp = where.get("messageTimestamp")
    if isinstance(stamp, dict) and stamp.get("gte") and stamp.get("lte"):
        gte, lte = _epoch(stamp["gte"]), _epoch(stamp["lte"])
        if gte is not None and lte is not None and not gte <= r["messageTimestamp"] <= lte:
            return False
    return True


@halts
async def find_messages(request: web.Request) -> web.StreamResponse:
    # allows POST /chat/findMessages/{instance}
    _, inst, body = await instance_route(request)
    problems = schemas.validate(schemas.MESSAGE_QUERY, body)
    if problems:
        return errors.validation_failed(problems)
    if not inst.loaded:
        return errors.not_loaded("fetchMessages")
    where: dict[str, Any] = body["where"] if isinstance(body.get("where"), dict) else {}
    key_id = where["key"].get("id") if isinstance(where.get("key"), dict) else None
    if key_id:  # key->>'id' = id: a reused id has a row per send
        found = [m for m in inst.indexed(key_id) if _matches(m, where)]
    else:
        found = [m for m in inst.messages.values() if _matches(m, where)]
    found.sort(key=lambda m: (m.response["messageTimestamp"], m.seq), reverse=True)
    offset, page = _page(body)
    start = offset * (page - 1)
    total = len(found)
    return errors.reply(200, {"messages": {
        "total": total,
        "pages": math.ceil(total / offset),
        "currentPage": page,
        "records": [shapes.message_record(m) for m in found[start:start + offset]],
    }})
