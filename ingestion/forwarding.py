"""The internal forward: a saved event POSTed to the webhook handler with already_saved (seeds B)."""

from __future__ import annotations

from typing import Any

import requests
from django.conf import settings

INTERNAL_SECRET_HEADER = "x-internal-webhook-secret"
# Connect fast (the web is local or behind a load balancer), read long enough for a handler
# waiting on a row lock held by the other channel.
TIMEOUT = (3.0, 10.0)

_session = requests.Session()


def forward(payload: dict[str, Any], timeout: tuple[float, float] = TIMEOUT) -> tuple[bool, str]:
    """(True, "") on a 2xx; otherwise (False, what went wrong)."""
    body = {k: v for k, v in payload.items() if k != "already_saved"}
    body["already_saved"] = True
    try:
        response = _session.post(
            settings.INTERNAL_WEBHOOK_URL,
            json=body,
            headers={INTERNAL_SECRET_HEADER: settings.INTERNAL_WEBHOOK_SECRET},
            timeout=timeout,
        )
    except requests.RequestException as exc:
        return False, f"{exc.__class__.__name__}: {exc}"[:300]
    if 200 <= response.status_code < 300:
        return True, ""
    return False, f"HTTP {response.status_code}: {response.text[:200]}"
