"""Per-instance event settings: webhook/set, webhook/find, rabbitmq/set."""

from __future__ import annotations

import re

from aiohttp import web

from . import errors, schemas, shapes
from .guards import halts, instance_route

# class-validator isURL({require_tld: false}) in spirit: optional http(s) scheme, a host.
_URL = re.compile(r"^(https?://)?[^\s/$.?#][^\s]*$", re.IGNORECASE)


@halts
async def set_webhook(request: web.Request) -> web.StreamResponse:
    # allows POST /webhook/set/{instance}
    _, inst, body = await instance_route(request)
    problems = schemas.validate(schemas.WEBHOOK, body)
    if problems:
        return errors.validation_failed(problems)
    if not inst.loaded:
        return errors.not_loaded("instanceId")
    data = body["webhook"]
    if not _URL.match(data["url"]):
        return errors.bad_request('Invalid "url" property')
    hook = inst.webhook
    hook.enabled = data["enabled"]
    hook.url = data["url"]
    hook.headers = dict(data.get("headers") or {})
    hook.by_events = bool(data.get("byEvents", False))
    hook.base64 = bool(data.get("base64", False))
    # Evolution stores [] when disabled and every event when enabled with an empty list.
    events = list(data.get("events") or [])
    hook.events = (events or list(schemas.EVENTS)) if hook.enabled else []
    hook.touch()
    return errors.reply(201, shapes.webhook_row(inst))


@halts
async def find_webhook(request: web.Request) -> web.StreamResponse:
    # allows GET /webhook/find/{instance}
    _, inst, _ = await instance_route(request)
    if not inst.loaded:
        return errors.reply(200, None)
    return errors.reply(200, shapes.webhook_row(inst))


@halts
async def set_rabbitmq(request: web.Request) -> web.StreamResponse:
    # allows POST /rabbitmq/set/{instance}
    world, inst, body = await instance_route(request)
    problems = schemas.validate(schemas.RABBITMQ, body)
    if problems:
        return errors.validation_failed(problems)
    if not world.cfg.rabbitmq_url:
        # RABBITMQ_ENABLED=false: the controller returns undefined, Express sends no body.
        return web.Response(status=201, content_type="application/json", charset="utf-8")
    if not inst.loaded:
        return errors.not_loaded("instanceId")
    data = body["rabbitmq"]
    row = inst.rabbitmq
    row.enabled = data["enabled"]
    events = list(data.get("events") or [])
    row.events = (events or list(schemas.EVENTS)) if row.enabled else []
    row.touch()
    return errors.reply(201, shapes.rabbitmq_row(inst))
