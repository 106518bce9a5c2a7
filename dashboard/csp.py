"""A Content-Security-Policy for dashboard pages whose scripts all come from this origin.

The overview (and its charts: Chart.js is vendored under static/dashboard, see VENDORED.md) loads only
same-origin scripts and styles, has no inline script or style attribute, and needs no eval, so it can
refuse everything else. Pages still holding an inline `style=` (the bulk job's progress bar) do not
carry it yet.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse

POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
    "form-action 'self'",
])


def same_origin_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response.setdefault("Content-Security-Policy", POLICY)
        return response
    return wrapper
