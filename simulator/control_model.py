"""Control routes for what WhatsApp does around our sends: the ban model's standings, and messages that
reach Evolution from elsewhere (typed on the phone, written by a contact). No auth, like /_control."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from aiohttp import web

from . import ids, shapes
from .banmodel import Standing
from .control import fail, handled, read_body
from .errors import reply
from .keys import WHATSAPP, WORLD
from .state import Instance

_MESSAGE_KEYS = {"number", "text", "from_me", "device", "at", "id", "push_name"}
_MAX_TEXT = 65536
_VARCHAR = 100  # Message.pushName and MessageUpdate.keyId are VARCHAR(100) in Evolution's schema
_LAST_EPOCH = 2**31 - 1  # messageTimestamp is an Int column


def _live(request: web.Request) -> Instance:
    inst = request.app[WORLD].live(request.match_info["name"])
    if inst is None:
        raise fail("no such instance", 404)
    return inst


@handled
async def standings(request: web.Request) -> web.StreamResponse:
    world, whatsapp = request.app[WORLD], request.app[WHATSAPP]
    every = {name: whatsapp.standing(inst) for name, inst in world.instances.items()}
    return reply(200, {
        "time_scale": world.cfg.time_scale,
        "model_now_s": round(world.clock.now(), 3),
        "banned": sorted(name for name, s in every.items() if s["banned"]),
        "disconnected": sorted(name for name, s in every.items() if s["status"] == "disconnected"),
        "instances": every,
    })


@handled
async def set_standing(request: web.Request) -> web.StreamResponse:
    """{"clear": true} forgets what the model holds against the number (a ban too; a closed instance
    stays closed until its state is set); {"warm": ["5511..."]} marks contacts it already talked to."""
    inst = _live(request)
    body = await read_body(request)
    if not isinstance(body, dict) or set(body) - {"clear", "warm"}:
        raise fail('body must be {"clear": true} and/or {"warm": ["<number>", ...]}')
    clear, warm = body.get("clear", False), body.get("warm", [])
    if not isinstance(clear, bool):
        raise fail("clear must be a boolean")
    if not isinstance(warm, list) or len(warm) > 100_000 or not all(
            isinstance(n, str) and ids.digits_of(n) for n in warm):
        raise fail("warm must be a list of phone numbers or jids")
    whatsapp = request.app[WHATSAPP]
    if clear:
        inst.standing = Standing()
    for number in warm:
        inst.warm.add(inst.contact(ids.create_jid(number)))
    return reply(200, whatsapp.standing(inst))


def _timestamp(value: Any) -> int:
    if value is None:
        return int(time.time())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        stamp = int(value)
    elif isinstance(value, str):
        try:
            stamp = int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp())
        except ValueError:
            raise fail("at must be unix seconds or an ISO 8601 time") from None
    else:
        raise fail("at must be unix seconds or an ISO 8601 time")
    if not 0 < stamp <= _LAST_EPOCH:
        raise fail("at is out of range")
    return stamp


def _optional_text(body: dict[str, Any], name: str, longest: int) -> str | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, str) or not value or len(value) > longest):
        raise fail(f"{name} must be a non-empty string of at most {longest} characters")
    return value


@handled
async def relayed_message(request: web.Request) -> web.StreamResponse:
    """A message Evolution receives without having sent it: typed on the account's phone (`from_me`, the
    default) or written by the contact. Stored for findMessages, emitted as messages.upsert."""
    inst = _live(request)
    body = await read_body(request)
    if not isinstance(body, dict):
        raise fail("body must be a JSON object")
    unknown = set(body) - _MESSAGE_KEYS
    if unknown:
        raise fail(f"unknown field(s): {', '.join(sorted(unknown))}")
    number, text = body.get("number"), body.get("text")
    if not isinstance(number, str) or not ids.digits_of(number):
        raise fail("number must be a phone number or jid")
    if not isinstance(text, str) or not text.strip() or len(text) > _MAX_TEXT:
        raise fail(f"text must be a non-blank string of at most {_MAX_TEXT} characters")
    from_me = body.get("from_me", True)
    if not isinstance(from_me, bool):
        raise fail("from_me must be a boolean")
    device = body.get("device", "android")
    if device not in ids.DEVICES:
        raise fail(f"device must be one of {', '.join(ids.DEVICES)}")
    key_id = _optional_text(body, "id", _VARCHAR) or ids.device_message_id(device)
    push_name = _optional_text(body, "push_name", _VARCHAR) or ("Você" if from_me else "Contato")
    at = _timestamp(body.get("at"))
    whatsapp = request.app[WHATSAPP]
    jid, exists = whatsapp.lookup(inst, number)
    if not exists or ids.is_group(jid):
        raise fail(f"{number} is not a contact on WhatsApp")
    msg = whatsapp.relayed_message(inst, jid, text, from_me=from_me, device=device, at=at, key_id=key_id,
                                   push_name=push_name)
    return reply(200, shapes.message_record(msg))


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/_control/standing", standings)
    r.add_post("/_control/instances/{name}/standing", set_standing)
    r.add_post("/_control/instances/{name}/messages", relayed_message)
