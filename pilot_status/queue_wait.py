"""How long the request this thread serves waited for a thread, and whether to shed it.

The webhook pool's gunicorn worker (pilot_status.webhook_worker) stamps each request when it
joins the pool's queue and hands the stamp to the thread that serves it; the internal app
(pilot_status.internal_wsgi) asks `waited()` before any work. Evolution posts every event at
once, with no limit on its sockets, and gives up after 30 s (WEBHOOK_REQUEST_TIMEOUT_MS), then
retries. A receipt storm that outruns the pool therefore fills its queue past that timeout: each
request is then served after its sender has left, and its retry queues behind it again, so the
pool works more and more for the same events. Shedding a webhook that already waited too long
(503 at once, no work) keeps the queue shorter than the timeout: Evolution retries it with its
backoff, and the event's RabbitMQ copy reaches us through the consumer meanwhile.
"""

from __future__ import annotations

import threading
import time

_local = threading.local()


def stamp(queued_at: float | None) -> None:
    """The worker thread's request joined the queue at `queued_at` (time.monotonic); None: unknown."""
    _local.queued_at = queued_at


def waited(now: float | None = None) -> float:
    """Seconds the current request waited for this thread; 0 when no worker stamped it."""
    queued_at: float | None = getattr(_local, "queued_at", None)
    if queued_at is None:
        return 0.0
    return max(0.0, (time.monotonic() if now is None else now) - queued_at)


def should_shed(waited_s: float, limit_s: float) -> bool:
    """A limit of 0 turns shedding off."""
    return limit_s > 0 and waited_s > limit_s
