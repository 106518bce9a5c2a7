"""Typed keys for the objects the aiohttp application shares between handlers."""

from __future__ import annotations

from aiohttp import web

from .events import Emitter
from .rabbit import RabbitPublisher
from .state import World
from .webhooks import WebhookSender
from .whatsapp import WhatsApp

WORLD: web.AppKey[World] = web.AppKey("world")
WHATSAPP: web.AppKey[WhatsApp] = web.AppKey("whatsapp")
EMITTER: web.AppKey[Emitter] = web.AppKey("emitter")
WEBHOOKS: web.AppKey[WebhookSender] = web.AppKey("webhooks")
RABBIT: web.AppKey[RabbitPublisher | None] = web.AppKey("rabbit")
