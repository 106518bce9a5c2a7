"""The guard chain every Evolution router runs: body parsing, instance existence, auth.

Order matters and is Evolution's: body-parser (400 malformed JSON) runs before routing;
then ``instanceExistsGuard`` (404, even without an apikey), then ``authGuard`` (401).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from . import errors, jsonbody
from .keys import WORLD
from .state import Instance, World

log = logging.getLogger("simulator")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def halts(handler: Handler) -> Handler:
    """Turn a raised :class:`errors.Halt` into its response, and a bug into Evolution's 500."""

    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except errors.Halt as halt:
            return halt.response
        except Exception as exc:  # like Express' handler: any JS error becomes a 500 envelope
            log.exception("unexpected error in %s %s", request.method, request.path)
            return errors.js_error(str(exc))

    return wrapper


def is_global_key(request: web.Request, world: World) -> bool:
    return request.headers.get("apikey") == world.cfg.api_key


async def instance_route(request: web.Request, *, body: bool = True) -> tuple[World, Instance, Any]:
    """Run the guards of a ``/{instance}`` route; return (world, instance, parsed body)."""
    world = request.app[WORLD]
    parsed = await jsonbody.read(request) if body else {}
    name = request.match_info["instance"]
    inst = world.live(name)
    if inst is None:
        raise errors.Halt(errors.instance_not_found(name))
    if inst.faults.latency_ms:
        await asyncio.sleep(inst.faults.latency_ms / 1000)
    key = request.headers.get("apikey")
    if not key or (key != world.cfg.api_key and key != inst.token):
        raise errors.Halt(errors.unauthorized())
    return world, inst, parsed
