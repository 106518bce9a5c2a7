"""The aiohttp application: Evolution's routes, the control API and the shared services."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from . import (__version__, control, control_model, errors, jsonbody, routes_events, routes_instance, routes_message,
               shapes)
from .config import GlobalConfig
from .events import Emitter
from .guards import halts
from .keys import EMITTER, RABBIT, WEBHOOKS, WHATSAPP, WORLD
from .rabbit import RabbitPublisher
from .state import World
from .webhooks import WebhookSender
from .whatsapp import WhatsApp

log = logging.getLogger("simulator")


async def root(request: web.Request) -> web.StreamResponse:
    # allows GET / (no auth): Evolution's welcome body, a good health check; GlobalConfig.root_status makes it
    # answer as a gateway whose root is elsewhere (a proxy's path prefix, another version) does
    status = request.app[WORLD].cfg.root_status
    if status != 200:
        return errors.reply(status, errors.envelope(status, errors.reason(status), [f"Cannot GET {request.raw_path}"]))
    return errors.reply(200, shapes.root(f"{request.scheme}://{request.host}", __version__))


@halts
async def unknown_route(request: web.Request) -> web.StreamResponse:
    # Express' last middleware: every unmatched method/path is a 404, never a 405.
    await jsonbody.read(request)  # body-parser runs first: malformed JSON is still a 400
    return errors.not_found(f"Cannot {request.method.upper()} {request.raw_path}")


def _serving_one_at_a_time(world: World) -> Any:
    """GlobalConfig.service_ms: each Evolution request first holds the one event loop's CPU for that long."""
    cpu = asyncio.Lock()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if world.cfg.service_ms and not request.path.startswith("/_control"):
            world.stats.queue_arrived()
            try:
                async with cpu:
                    await asyncio.sleep(world.cfg.service_ms / 1000)
            finally:
                world.stats.queue_left()
        return await handler(request)

    return middleware


def make_app(cfg: GlobalConfig, preload: list[dict[str, Any]] | None = None) -> web.Application:
    world = World(cfg)
    app = web.Application(  # Evolution's body limit: 136mb
        client_max_size=136 * 1024 * 1024, middlewares=[_serving_one_at_a_time(world)],
    )
    webhooks = WebhookSender(world)
    rabbit = RabbitPublisher(world, cfg.rabbitmq_url) if cfg.rabbitmq_url else None
    emitter = Emitter(world, webhooks, rabbit)
    whatsapp = WhatsApp(world, emitter)
    app[WORLD], app[WEBHOOKS], app[RABBIT], app[EMITTER], app[WHATSAPP] = world, webhooks, rabbit, emitter, whatsapp

    for entry in preload or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError("every preload entry needs a string 'name'")
        try:
            control.apply_instance(world, whatsapp, entry["name"], entry)
        except errors.Halt as halt:
            raise ValueError(f"preload {entry['name']!r}: {halt.response.text}") from None

    async def start(_: web.Application) -> None:
        await webhooks.start()
        if rabbit is not None:
            rabbit.start()

    async def stop(_: web.Application) -> None:
        await webhooks.close()
        if rabbit is not None:
            await rabbit.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)

    r = app.router
    r.add_get("/", root)
    r.add_post("/instance/create", routes_instance.create)
    r.add_get("/instance/fetchInstances", routes_instance.fetch_instances)
    r.add_get("/instance/connectionState/{instance}", routes_instance.connection_state)
    r.add_delete("/instance/delete/{instance}", routes_instance.delete)
    r.add_post("/message/sendText/{instance}", routes_message.send_text)
    r.add_post("/chat/sendPresence/{instance}", routes_message.send_presence)
    r.add_post("/chat/whatsappNumbers/{instance}", routes_message.whatsapp_numbers)
    r.add_post("/chat/findStatusMessage/{instance}", routes_message.find_status_message)
    r.add_post("/chat/findMessages/{instance}", routes_message.find_messages)
    r.add_get("/baileys/generateMessageID/{instance}", routes_message.generate_message_id)
    r.add_post("/webhook/set/{instance}", routes_events.set_webhook)
    r.add_get("/webhook/find/{instance}", routes_events.find_webhook)
    r.add_post("/rabbitmq/set/{instance}", routes_events.set_rabbitmq)
    control.add_routes(app)
    control_model.add_routes(app)
    r.add_route("*", "/{tail:.*}", unknown_route)  # last: see unknown_route
    return app


def load_preload(path: str | None) -> list[dict[str, Any]]:
    if not path:
        return []
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError("--preload must hold a JSON list of instance configs")
    return data
