"""The webhook pool's access log: failed requests only (gunicorn --logger-class).

Evolution posts about four webhooks per message and the consumer forwards more; a line for each
success would be most of the pool's log and a measurable share of its CPU. A success
leaves its own record (the event's inbox row and the `webhook:*` counters), so only the requests
that an operator has to look at, 4xx and 5xx, are written, in gunicorn's usual format.
"""

from __future__ import annotations

from typing import Any

from gunicorn.glogging import Logger  # type: ignore[import-untyped]


class FailedRequestsOnly(Logger):  # type: ignore[misc]
    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        status = getattr(resp, "status_code", None)
        if isinstance(status, int) and status < 400:
            return
        super().access(resp, req, environ, request_time)
