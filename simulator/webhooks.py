"""Webhook delivery with Evolution 2.3's retry policy (webhook.controller.ts retryWebhookRequest).

One shared ClientSession pools connections to the receivers. Each delivery runs in its own
background task, so a slow or failing receiver never blocks an HTTP answer, and retries of
one event run sequentially inside that event's task, like Evolution's.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import aiohttp

from .state import World

log = logging.getLogger("simulator.webhooks")

# What axios sends besides the JSON body (Evolution posts with axios).
_BASE_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/plain, */*",
    "User-Agent": "axios/1.7.9",
}


def next_delay(attempt: int, retry: dict[str, Any], rnd: float | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based), as Evolution computes it."""
    initial = float(retry["initial_delay_s"])
    if not retry.get("exponential", True):
        return initial
    delay = min(initial * 2 ** (attempt - 1), float(retry["max_delay_s"]))
    r = random.random() if rnd is None else rnd
    delay += delay * float(retry["jitter"]) * (r * 2 - 1)
    return float(max(initial, delay))


class WebhookSender:
    def __init__(self, world: World) -> None:
        self.world = world
        self.session: aiohttp.ClientSession | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        # No limit on sockets, as Evolution's axios on Node's default agent: every pending event is
        # on the wire at once, and its timeout runs from its own POST. A limit here would queue the
        # posts inside the simulator, where their timeouts expire before the receiver sees them.
        # Keep-alive reuses the sockets.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",))

    async def close(self) -> None:
        self.cancel_all()
        if self.session is not None:
            await self.session.close()

    def cancel_all(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        self.tasks.clear()

    def submit(self, url: str, body: bytes, headers: dict[str, str] | None) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver(url, body, headers))
        # Keep a reference: the loop holds tasks only weakly.
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _deliver(self, url: str, body: bytes, custom: dict[str, str] | None) -> None:
        assert self.session is not None
        headers = dict(_BASE_HEADERS)
        if custom:
            headers.update(custom)
        cfg = self.world.cfg
        retry = dict(cfg.webhook_retry)
        non_retryable = set(retry.get("non_retryable_status_codes") or ())
        max_attempts = max(1, int(retry["max_attempts"]))
        timeout = aiohttp.ClientTimeout(total=cfg.webhook_timeout_s)
        attempt = 0
        while True:
            attempt += 1
            self.world.stats.wh_posted += 1
            status: int | None = None
            problem = ""
            try:
                async with self.session.post(url, data=body, headers=headers, timeout=timeout) as resp:
                    status = resp.status
                    await resp.read()  # drain so the connection goes back to the pool
            except asyncio.TimeoutError:
                problem = "timeout"
            except (aiohttp.ClientError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            stats = self.world.stats  # read again: a reset may have replaced it meanwhile
            if status is not None and 200 <= status < 300:
                stats.wh_ok += 1
                return
            if status is not None:
                problem = f"HTTP {status}"
            if status in non_retryable:
                stats.wh_failed += 1
                log.warning("webhook %s: %s is not retryable, giving up", url, problem)
                return
            if attempt >= max_attempts:
                stats.wh_failed += 1
                log.warning("webhook %s: %s, giving up after %d attempts", url, problem, attempt)
                return
            delay = next_delay(attempt, retry)
            log.info("webhook %s: %s, retry %d in %.2fs", url, problem, attempt, delay)
            stats.wh_retried += 1
            await asyncio.sleep(delay)
