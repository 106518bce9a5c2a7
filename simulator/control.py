"""The /_control API: instance set-up, faults, global settings, inspection, reset. No auth."""

from __future__ import annotations

import asyncio
import copy
import time
from collections import deque
from typing import Any

from aiohttp import web

from . import banmodel, collector, jsonbody
from .errors import Halt, reply
from .events import upper_name
from .faults import Faults
from .ids import digits_of
from .keys import EMITTER, RABBIT, WEBHOOKS, WHATSAPP, WORLD
from .state import STATES, Instance, World
from .whatsapp import WhatsApp

_INSTANCE_KEYS = {"name", "id", "token", "state", "status_reason", "deleted", "loaded", "owner_jid",
                  "profile_name", "profile_picture_url", "integration", "webhook", "rabbitmq", "faults", "lids",
                  "ignore_message_id", "ban_model"}
_RETRY_KEYS = {"max_attempts", "initial_delay_s", "max_delay_s", "jitter", "exponential",
               "non_retryable_status_codes"}


def fail(message: str, status: int = 400) -> Halt:
    return Halt(reply(status, {"error": message}))


def _events(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(f"{field} must be a list of event names")
    return [upper_name(v) for v in value]


def _opt_str(value: Any, field: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise fail(f"{field} must be a string or null")
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise fail(f"{field} must be a boolean")
    return value


def _number(value: Any, field: str, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise fail(f"{field} must be a number >= 0")
    return value


def apply_instance(world: World, whatsapp: WhatsApp, name: str, patch: dict[str, Any]) -> Instance:
    """Create or update (merge) an instance from a control-API body."""
    if not isinstance(patch, dict):
        raise fail("body must be a JSON object")
    unknown = set(patch) - _INSTANCE_KEYS
    if unknown:
        raise fail(f"unknown field(s): {', '.join(sorted(unknown))}")
    state = patch.get("state")
    if state is not None and state not in STATES:
        raise fail(f"state must be one of {', '.join(STATES)}")
    inst = world.instances.get(name)
    if state is not None and state != "close" and inst is not None and inst.standing.banned:
        raise fail(f"{name} is banned by the ban model: POST /_control/instances/{name}/standing "
                   '{"clear": true} first', 409)
    ban_overrides: dict[str, Any] | None = None
    if "ban_model" in patch:
        try:
            ban_overrides = banmodel.merge_params(inst.ban_model if inst else {}, patch["ban_model"], instance=True)
        except ValueError as exc:
            raise fail(str(exc)) from None
    faults: Faults | None = None
    if "faults" in patch:
        # Merge into a copy so a bad field leaves the instance untouched.
        faults = copy.deepcopy(inst.faults) if inst else Faults()
        try:
            faults.merge(patch["faults"])
        except ValueError as exc:
            raise fail(str(exc)) from None
    is_new = inst is None
    if inst is None:
        inst = Instance(name=name)
        if state is not None:
            inst.state = state
            inst.has_been_open = state == "open"
    if faults is not None:
        inst.faults = faults
    if ban_overrides is not None:
        inst.ban_model = ban_overrides
    for field in ("id", "token", "owner_jid", "integration"):
        if field in patch:
            value = _opt_str(patch[field], field)
            if not value:
                raise fail(f"{field} must be a non-empty string")
            setattr(inst, field, value)
    for field in ("profile_name", "profile_picture_url"):
        if field in patch:
            setattr(inst, field, _opt_str(patch[field], field))
    for field in ("deleted", "loaded", "ignore_message_id"):
        if field in patch:
            setattr(inst, field, _bool(patch[field], field))
    if "lids" in patch:
        inst.lids = _lids(patch["lids"])
    if "webhook" in patch:
        _apply_webhook(inst, patch["webhook"])
    if "rabbitmq" in patch:
        _apply_rabbitmq(inst, patch["rabbitmq"])
    reason = patch.get("status_reason")
    if reason is not None and (not isinstance(reason, int) or isinstance(reason, bool)):
        raise fail("status_reason must be an integer")
    if is_new:
        world.instances[name] = inst  # only once the whole body was valid
    elif state is not None:
        whatsapp.set_state(inst, state, reason)
    return inst


def _lids(value: Any) -> dict[str, str]:
    """Contacts WhatsApp addresses by LID: phone number (digits) → its `…@lid` jid."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v.endswith("@lid") and v[:-4].isdigit() for k, v in value.items()
    ):
        raise fail("lids must map phone numbers to jids like 123456789012345@lid")
    return {digits_of(k): v for k, v in value.items()}


def _apply_webhook(inst: Instance, data: Any) -> None:
    if not isinstance(data, dict):
        raise fail("webhook must be an object")
    unknown = set(data) - {"enabled", "url", "byEvents", "base64", "headers", "events"}
    if unknown:
        raise fail(f"unknown webhook field(s): {', '.join(sorted(unknown))}")
    hook = inst.webhook
    if "url" in data:
        hook.url = _opt_str(data["url"], "webhook.url")
        # Setting a URL without saying otherwise means "deliver to it".
        hook.enabled = bool(hook.url) if "enabled" not in data else hook.enabled
    if "enabled" in data:
        hook.enabled = _bool(data["enabled"], "webhook.enabled")
    if "byEvents" in data:
        hook.by_events = _bool(data["byEvents"], "webhook.byEvents")
    if "base64" in data:
        hook.base64 = _bool(data["base64"], "webhook.base64")
    if "headers" in data:
        if not isinstance(data["headers"], dict):
            raise fail("webhook.headers must be an object")
        hook.headers = dict(data["headers"])
    if "events" in data:
        hook.events = _events(data["events"], "webhook.events")
    hook.touch()


def _apply_rabbitmq(inst: Instance, data: Any) -> None:
    if not isinstance(data, dict):
        raise fail("rabbitmq must be an object")
    unknown = set(data) - {"enabled", "events"}
    if unknown:
        raise fail(f"unknown rabbitmq field(s): {', '.join(sorted(unknown))}")
    if "enabled" in data:
        inst.rabbitmq.enabled = _bool(data["enabled"], "rabbitmq.enabled")
    if "events" in data:
        inst.rabbitmq.events = _events(data["events"], "rabbitmq.events")
    inst.rabbitmq.touch()


def apply_global(world: World, patch: Any) -> None:
    if not isinstance(patch, dict):
        raise fail("body must be a JSON object")
    cfg = world.cfg
    for key, value in patch.items():
        if key in ("webhook_url", "server_url"):
            setattr(cfg, key, _opt_str(value, key))
        elif key in ("api_key", "exchange"):
            if not isinstance(value, str) or not value:
                raise fail(f"{key} must be a non-empty string")
            setattr(cfg, key, value)
        elif key == "prefix":
            cfg.prefix = _opt_str(value, key) or ""
        elif key in ("by_events", "rabbitmq_global", "declare_queues"):
            setattr(cfg, key, _bool(value, key))
        elif key in ("webhook_events", "rabbitmq_events"):
            setattr(cfg, key, _events(value, key))
        elif key == "time_scale":
            try:
                cfg.time_scale = banmodel.check_time_scale(value)
            except ValueError as exc:
                raise fail(str(exc)) from None
            world.clock.set_scale(cfg.time_scale)
        elif key == "ban_model":
            try:
                cfg.ban_model = banmodel.merge_params(cfg.ban_model, value, instance=False)
            except ValueError as exc:
                raise fail(str(exc)) from None
        elif key == "service_ms":
            cfg.service_ms = float(_number(value, key))
            if not 0 <= cfg.service_ms <= 10_000:
                raise fail("service_ms must be between 0 and 10000")
        elif key == "root_status":
            if isinstance(value, bool) or not isinstance(value, int) or not 200 <= value <= 599:
                raise fail("root_status must be an HTTP status from 200 to 599")
            cfg.root_status = value
        elif key == "webhook_timeout_s":
            cfg.webhook_timeout_s = float(_number(value, key))
        elif key == "auto_pair_ms":
            cfg.auto_pair_ms = _number(value, key, allow_none=True)
        elif key == "max_stored_messages":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise fail("max_stored_messages must be a positive integer")
            cfg.max_stored_messages = value
            world.sends = deque(world.sends, maxlen=value)
        elif key == "ack_delays_ms":
            if not isinstance(value, dict):
                raise fail("ack_delays_ms must be an object")
            for status, ms in value.items():
                _number(ms, f"ack_delays_ms.{status}", allow_none=True)
            cfg.ack_delays_ms.update(value)
        elif key == "webhook_retry":
            if not isinstance(value, dict) or set(value) - _RETRY_KEYS:
                raise fail(f"webhook_retry accepts {', '.join(sorted(_RETRY_KEYS))}")
            for name, item in value.items():
                if name == "exponential":
                    _bool(item, f"webhook_retry.{name}")
                elif name == "non_retryable_status_codes":
                    if not isinstance(item, list) or not all(isinstance(c, int) for c in item):
                        raise fail("webhook_retry.non_retryable_status_codes must be a list of integers")
                else:
                    _number(item, f"webhook_retry.{name}")
            cfg.webhook_retry.update(value)
        else:
            raise fail(f"unknown field {key!r}")


async def read_body(request: web.Request) -> Any:
    try:
        return await jsonbody.read(request) if request.body_exists else {}
    except Halt:
        raise fail("body is not valid JSON") from None


def handled(handler: Any) -> Any:
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            result: web.StreamResponse = await handler(request)
            return result
        except Halt as halt:
            return halt.response

    return wrapper


@handled
async def list_instances(request: web.Request) -> web.StreamResponse:
    world = request.app[WORLD]
    return reply(200, [inst.config() for inst in world.instances.values()])


@handled
async def put_instance(request: web.Request) -> web.StreamResponse:
    world = request.app[WORLD]
    inst = apply_instance(world, request.app[WHATSAPP], request.match_info["name"], await read_body(request))
    return reply(200, inst.config())


@handled
async def get_instance(request: web.Request) -> web.StreamResponse:
    inst = request.app[WORLD].instances.get(request.match_info["name"])
    if inst is None:
        raise fail("no such instance", 404)
    return reply(200, {**inst.config(), "counters": inst.counters(), "standing": request.app[WHATSAPP].standing(inst)})


@handled
async def get_global(request: web.Request) -> web.StreamResponse:
    return reply(200, request.app[WORLD].cfg.to_dict())


@handled
async def post_global(request: web.Request) -> web.StreamResponse:
    world = request.app[WORLD]
    apply_global(world, await read_body(request))
    return reply(200, world.cfg.to_dict())


@handled
async def emit(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("event"), str) or not isinstance(body.get("instance"), str):
        raise fail('body must be {"instance": str, "event": str, "data": ...} or {"instance", "event", "batch": [...]}')
    if "batch" in body and ("data" in body or not isinstance(body["batch"], list)):
        raise fail('"batch" must be a list of data items, and comes instead of "data"')
    wait_below = body.get("wait_below")
    if wait_below is not None and (isinstance(wait_below, bool) or not isinstance(wait_below, int) or wait_below < 0):
        raise fail('"wait_below" must be a whole number ≥ 0 (webhooks still pending)')
    inst = request.app[WORLD].instances.get(body["instance"])
    if inst is None:
        raise fail("no such instance", 404)
    # A batch is many events for the price of one control call: a load generator's own HTTP
    # work must not compete with the system under test (Evolution emits without being asked).
    items = body["batch"] if "batch" in body else [body.get("data")]
    if wait_below is not None:
        # Closed-loop load without polling /_control/stats: answer once at most `wait_below`
        # webhooks are still pending (a checking loop here costs far less than an HTTP poll).
        pending = request.app[WEBHOOKS].tasks
        while len(pending) > wait_below:
            await asyncio.sleep(0.005)
    emitter = request.app[EMITTER]
    for data in items:
        emitter.emit(inst, body["event"], data)  # any JSON, as given
    if body["event"] == "messages.upsert":  # a contact wrote (or the phone did): the chat is warm
        for data in items:
            request.app[WHATSAPP].note_exchange(inst, data)
    return reply(200, {"emitted": body["event"], "count": len(items)})


@handled
async def sends(request: web.Request) -> web.StreamResponse:
    world = request.app[WORLD]
    instance = request.query.get("instance")
    number = request.query.get("number")
    wanted = digits_of(number) if number else None
    out = [r for r in world.sends
           if (not instance or r["instance"] == instance)
           and (number is None or r["number"] == number
                or (wanted and isinstance(r["number"], str) and digits_of(r["number"]) == wanted))]
    return reply(200, out)


@handled
async def stats(request: web.Request) -> web.StreamResponse:
    world = request.app[WORLD]
    s = world.stats
    rabbit = request.app[RABBIT]
    return reply(200, {
        "send_text": {"total": s.send_total, "by_status": dict(s.send_by_status),
                      "in_flight": s.send_in_flight, "max_in_flight": s.send_in_flight_max},
        "webhook": {"posted": s.wh_posted, "ok": s.wh_ok, "failed": s.wh_failed, "dropped": s.wh_dropped,
                    "duplicated": s.wh_duplicated, "retried": s.wh_retried,
                    "in_flight": len(request.app[WEBHOOKS].tasks)},
        "rabbitmq": {"published": s.rmq_published, "dropped": s.rmq_dropped, "duplicated": s.rmq_duplicated,
                     "failed": s.rmq_failed, "enabled": rabbit is not None,
                     "connected": bool(rabbit and rabbit.connected)},
        "gateway_queue": {"waiting": s.queue_waiting,
                          "on_arrival": {str(k): v for k, v in sorted(s.queue_on_arrival.items())}},
        "cpu_seconds": time.process_time(),
        "collector": collector.describe(),
        "uptime_s": time.monotonic() - s.started,
    })


@handled
async def reset(request: web.Request) -> web.StreamResponse:
    world = request.app[WORLD]
    body = await read_body(request)
    include_global = isinstance(body, dict) and body.get("global") is True
    world.reset(include_global)
    request.app[WEBHOOKS].cancel_all()  # no stale retries leaking into the next test
    rabbit = request.app[RABBIT]
    if rabbit is not None:
        rabbit.clear()
    collector.full()  # the full collection the simulator skips while it answers
    return reply(200, {"reset": True, "global": include_global})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/_control/instances", list_instances)
    r.add_post("/_control/instances/{name}", put_instance)
    r.add_get("/_control/instances/{name}", get_instance)
    r.add_get("/_control/global", get_global)
    r.add_post("/_control/global", post_global)
    r.add_post("/_control/emit", emit)
    r.add_get("/_control/sends", sends)
    r.add_get("/_control/stats", stats)
    r.add_post("/_control/reset", reset)
