"""Instance routes: create, fetchInstances, connectionState, delete (instance.router.ts)."""

from __future__ import annotations

from aiohttp import web

from . import errors, jsonbody, schemas, shapes
from .guards import halts, instance_route, is_global_key
from .keys import WHATSAPP, WORLD
from .state import Instance
from .whatsapp import qr_code
INTEGRATIONS = ("WHATSAPP-BAILEYS", "WHATSAPP-BUSINESS", "EVOLUTION")


@halts
async def create(request: web.Request) -> web.StreamResponse:
    # allows POST /instance/create
    world = request.app[WORLD]
    body = await jsonbody.read(request)
    name = body.get("instanceName") if isinstance(body, dict) else None
    # instanceLoggedGuard runs before the auth guard: a taken name is 403 even without a key.
    if isinstance(name, str) and world.live(name) is not None:
        return errors.forbidden(f'This name "{name}" is already in use.')
    if not is_global_key(request, world):
        return errors.unauthorized()  # a token may never create instances
    problems = schemas.validate(schemas.INSTANCE, body)
    if problems:
        return errors.validation_failed(problems)
    if not isinstance(name, str) or not name:
        return errors.bad_request("Argument `name` is missing.")
    integration = body.get("integration") or "WHATSAPP-BAILEYS"
    if integration not in INTEGRATIONS:
        return errors.bad_request("Invalid integration")
    # A freshly created Baileys instance is "close"; with qrcode it starts connecting.
    inst = Instance(name=name, state="close", has_been_open=False, integration=integration)
    if isinstance(body.get("token"), str) and body["token"]:
        inst.token = body["token"]
    hook = body.get("webhook")
    if isinstance(hook, dict) and isinstance(hook.get("url"), str):
        inst.webhook.enabled = hook.get("enabled", True) is not False
        inst.webhook.url = hook["url"]
        inst.webhook.by_events = bool(hook.get("byEvents", False))
        inst.webhook.base64 = bool(hook.get("base64", False))
        inst.webhook.headers = dict(hook["headers"]) if isinstance(hook.get("headers"), dict) else {}
        inst.webhook.events = list(hook.get("events") or schemas.EVENTS) if inst.webhook.enabled else []
        inst.webhook.touch()
    rmq = body.get("rabbitmq")
    if isinstance(rmq, dict) and request.app[WORLD].cfg.rabbitmq_url:
        inst.rabbitmq.enabled = rmq.get("enabled", True) is not False
        inst.rabbitmq.events = list(rmq.get("events") or schemas.EVENTS) if inst.rabbitmq.enabled else []
        inst.rabbitmq.touch()
    world.instances[name] = inst
    qrcode = None
    if body.get("qrcode") is True and integration == "WHATSAPP-BAILEYS":
        request.app[WHATSAPP].start_pairing(inst)
        qrcode = {**qr_code(inst), "count": 1}
        del qrcode["instance"]
    return errors.reply(201, shapes.create_result(inst, body, qrcode))


@halts
async def fetch_instances(request: web.Request) -> web.StreamResponse:
    # allows GET /instance/fetchInstances
    world = request.app[WORLD]
    await jsonbody.read(request)
    key = request.headers.get("apikey")
    name = request.query.get("instanceName")
    instance_id = request.query.get("instanceId")
    live = [i for i in world.instances.values() if not i.deleted]
    if not key:
        return errors.unauthorized()
    if key != world.cfg.api_key:
        # An instance token lists only the instances that carry it.
        mine = [i for i in live if i.token == key and (not name or i.name == name)
                and (not instance_id or i.id == instance_id)]
        if not mine:
            return errors.unauthorized()
        return errors.reply(200, [shapes.instance_info(i) for i in mine])
    if instance_id:
        live = [i for i in live if i.id == instance_id]
    if name:
        live = [i for i in live if i.name == name]
        if not live:
            return errors.not_found(f'Instance "{name}" not found')
    return errors.reply(200, [shapes.instance_info(i) for i in live])


@halts
async def connection_state(request: web.Request) -> web.StreamResponse:
    # allows GET /instance/connectionState/{instance}
    _, inst, _ = await instance_route(request)
    state = {"instanceName": inst.name}
    if inst.loaded:  # an instance only in the DB has no in-memory state: key omitted
        state["state"] = inst.state
    return errors.reply(200, {"instance": state})


@halts
async def delete(request: web.Request) -> web.StreamResponse:
    # allows DELETE /instance/delete/{instance}
    _, inst, _ = await instance_route(request)
    if inst.loaded and inst.state != "close":
        request.app[WHATSAPP].set_state(inst, "close", 401)  # logout first, like Evolution
    inst.deleted = True
    return errors.reply(200, {"status": "SUCCESS", "error": False, "response": {"message": "Instance deleted"}})
