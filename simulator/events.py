"""Event envelopes and their fan-out to webhooks and RabbitMQ, like Evolution's EventManager.

Webhook body key order: {event, instance, data, destination, date_time, sender, server_url,
apikey}; the RabbitMQ body is the same without ``destination``. ``sender`` is omitted until
the instance has been open once (it is undefined in Evolution until then).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

from . import hs256
from .errors import dumps
from .faults import roll
from .rabbit import RabbitPublisher
from .state import Instance, World
from .webhooks import WebhookSender

# Evolution's Docker image runs with TZ=America/Sao_Paulo and renders local time with a
# literal "Z" (it subtracts the offset, then calls toISOString()).
_LOCAL_OFFSET = timedelta(hours=-3)


def date_time() -> str:
    now = datetime.now(timezone.utc) + _LOCAL_OFFSET
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def upper_name(event: str) -> str:
    """messages.update -> MESSAGES_UPDATE (the name used in config and filters)."""
    return event.replace(".", "_").replace("-", "_").upper()


def kebab_name(event: str) -> str:
    """messages.update -> messages-update (the by-events URL suffix)."""
    return upper_name(event).replace("_", "-").lower()


def _is_url(url: str | None) -> bool:
    # Evolution sends nothing when the URL is not http(s).
    return bool(url) and url.startswith(("http://", "https://"))  # type: ignore[union-attr]


def webhook_headers(custom: dict[str, Any]) -> dict[str, str]:
    """The instance's custom headers; a ``jwt_key`` becomes an HS256 Bearer token."""
    headers = {str(k): str(v) for k, v in custom.items() if k != "jwt_key"}
    if "jwt_key" in custom:
        headers["Authorization"] = "Bearer " + hs256.webhook_token(str(custom["jwt_key"]))
    return headers


class Emitter:
    def __init__(self, world: World, webhooks: WebhookSender, rabbit: RabbitPublisher | None) -> None:
        self.world = world
        self.webhooks = webhooks
        self.rabbit = rabbit

    def emit_soon(self, inst: Instance, event: str, data: dict[str, Any]) -> None:
        """Emit after the current handler returns, so serialisation never delays its answer."""
        asyncio.get_running_loop().call_soon(self.emit, inst, event, data)

    def emit(self, inst: Instance, event: str, data: Any) -> None:
        cfg = self.world.cfg
        we = upper_name(event)
        hook = inst.webhook
        to_instance_hook = hook.enabled and _is_url(hook.url) and (not hook.events or we in hook.events)
        to_global_hook = _is_url(cfg.webhook_url) and (not cfg.webhook_events or we in cfg.webhook_events)
        rabbit = self.rabbit
        to_global_rmq = rabbit is not None and cfg.rabbitmq_global and (
            not cfg.rabbitmq_events or we in cfg.rabbitmq_events)
        to_instance_rmq = rabbit is not None and inst.rabbitmq.enabled and (
            not inst.rabbitmq.events or we in inst.rabbitmq.events)
        if not (to_instance_hook or to_global_hook or to_global_rmq or to_instance_rmq):
            return  # the common benchmark case: nothing configured, nothing to build
        inst.events_emitted += 1
        stamp = date_time()
        sender = inst.sender
        kebab = kebab_name(event)

        if to_instance_hook or to_global_hook:
            # destination is computed once and shared by both POSTs: the instance URL when
            # the instance has a webhook row, else the global URL + kebab suffix.
            destination = hook.url if hook.row_id and hook.url else f"{cfg.webhook_url or ''}/{kebab}"
            envelope: dict[str, Any] = {"event": event, "instance": inst.name, "data": data,
                                        "destination": destination, "date_time": stamp}
            if sender is not None:
                envelope["sender"] = sender
            envelope["server_url"] = cfg.server_url
            envelope["apikey"] = inst.token
            body = dumps(envelope)
            if to_instance_hook:
                url = f"{hook.url}/{kebab}" if hook.by_events else str(hook.url)
                self._post(inst, url, body, webhook_headers(hook.headers) if hook.headers else None)
            if to_global_hook:
                url = f"{cfg.webhook_url}/{kebab}" if cfg.by_events else str(cfg.webhook_url)
                self._post(inst, url, body, None)  # global webhooks carry no custom headers

        if rabbit is not None and (to_global_rmq or to_instance_rmq):
            # Key order of tests/simulator/samples/rabbitmq.*.body.json. rabbitmq.controller.ts may put
            # server_url right after data; the sources disagree and consumers must not depend on key
            # order either way.
            message: dict[str, Any] = {"event": event, "instance": inst.name, "data": data, "date_time": stamp}
            if sender is not None:
                message["sender"] = sender
            message["server_url"] = cfg.server_url
            message["apikey"] = inst.token
            body = dumps(message)
            if to_instance_rmq:
                self._publish(inst, rabbit, inst.name, event, body, f"{inst.name}.{event}")
            if to_global_rmq:
                queue = f"{cfg.prefix}.{event}" if cfg.prefix else event
                self._publish(inst, rabbit, cfg.exchange, event, body, queue)

    def _post(self, inst: Instance, url: str, body: bytes, headers: dict[str, str] | None) -> None:
        faults = inst.faults
        stats = self.world.stats
        if roll(faults.webhook_drop_rate):
            stats.wh_dropped += 1
            return
        self.webhooks.submit(url, body, headers)
        if roll(faults.webhook_duplicate_rate):
            stats.wh_duplicated += 1
            self.webhooks.submit(url, body, headers)

    def _publish(self, inst: Instance, rabbit: RabbitPublisher, exchange: str, key: str, body: bytes,
                 queue: str) -> None:
        faults = inst.faults
        stats = self.world.stats
        if roll(faults.rabbitmq_drop_rate):
            stats.rmq_dropped += 1
            return
        rabbit.publish(exchange, key, body, queue)
        if roll(faults.rabbitmq_duplicate_rate):
            stats.rmq_duplicated += 1
            rabbit.publish(exchange, key, body, queue)
