"""The webhook pool's gunicorn worker: gthread, plus how long each request waited for a thread.

gthread queues a request for its thread pool when its connection is accepted, or when a kept-alive
connection sends again; nothing records how long it then waits. This worker stamps that moment
and hands it to the serving thread (pilot_status.queue_wait), where the internal app sheds what
waited too long. Run it with `--worker-class pilot_status.webhook_worker.QueueTimedThreadWorker`
(the Procfile's `webhook`).
"""

from __future__ import annotations

import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from . import queue_wait


class QueueTimedThreadWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn has no type hints
    def enqueue_req(self, conn: Any) -> None:
        conn.ps_queued_at = time.monotonic()
        super().enqueue_req(conn)

    def handle_request(self, req: Any, conn: Any) -> Any:
        queue_wait.stamp(getattr(conn, "ps_queued_at", None))
        try:
            return super().handle_request(req, conn)
        finally:
            queue_wait.stamp(None)
