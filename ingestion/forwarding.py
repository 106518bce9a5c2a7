"""The internal forward: a saved event POSTed to the webhook handler with already_saved (docs/internals.md, "Path of an event").

urllib3 directly, not requests: every event the consumer takes first is forwarded, so the forward is a large
share of the consumer's CPU, and requests' session machinery (the environment's proxy settings read on every
call, hooks, cookies, its adapter) nearly doubles what a forward costs (bench/findings.md, "The forwarded
event"). No retries and no redirects: a failed forward goes to the retry queues, where it is counted.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from django.conf import settings

INTERNAL_SECRET_HEADER = "x-internal-webhook-secret"
# Connect fast (the web is local or behind a load balancer), read long enough for a handler
# waiting on a row lock held by the other channel.
TIMEOUT = (3.0, 10.0)

_pool = urllib3.PoolManager(retries=False)


def forward(payload: dict[str, Any], timeout: tuple[float, float] = TIMEOUT) -> tuple[bool, str]:
    """(True, "") on a 2xx; otherwise (False, what went wrong)."""
    body = {k: v for k, v in payload.items() if k != "already_saved"}
    body["already_saved"] = True
    try:
        response = _pool.request(
            "POST",
            settings.INTERNAL_WEBHOOK_URL,
            body=json.dumps(body, allow_nan=False).encode(),
            headers={"Content-Type": "application/json", INTERNAL_SECRET_HEADER: settings.INTERNAL_WEBHOOK_SECRET},
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
            redirect=False,
        )
    except (urllib3.exceptions.HTTPError, ValueError) as exc:  # ValueError: a URL urllib3 cannot use
        return False, f"{exc.__class__.__name__}: {exc}"[:300]
    if 200 <= response.status < 300:
        return True, ""
    return False, f"HTTP {response.status}: {response.data[:200].decode(errors='replace')}"
