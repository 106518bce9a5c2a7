"""The webhook pool's WSGI app: Evolution's webhooks, the consumer's forwards and the counters.

It routes /api/internal/ only (pilot_status.internal_urls; anything else is a 404) through the one
middleware those endpoints need, the JSON error envelope. The browser middleware of the full app
(static files, sessions, CSRF, auth, messages, security headers) does nothing for a webhook but
cost ≈ 0.09 ms of CPU per request (bench/findings.md, B5). The admin and the dashboard are never
served here, so they always keep that middleware (pilot_status.wsgi on `web`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import django
from django.conf import settings
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from . import metrics, queue_wait
from .errors import error_body

URLCONF = "pilot_status.internal_urls"
WEBHOOK_PATH = "/api/internal/webhook"
# Evolution waits this long before its next attempt at the earliest (its initial retry delay).
SHED_RETRY_AFTER_S = 5
_SHED_BODY = json.dumps(error_body(
    "overloaded", "The webhook pool is behind; this event was not read. Retry later.",
)).encode()
_SHED_HEADERS = [
    ("Content-Type", "application/json"),
    ("Content-Length", str(len(_SHED_BODY))),
    ("Retry-After", str(SHED_RETRY_AFTER_S)),
]


def sheds(environ: dict[str, Any], waited_s: float) -> bool:
    """Evolution's own webhooks only: the consumer's forwards (they carry the internal secret)
    are paced by the consumer and already hold their event in the inbox, so they always go on."""
    return (
        queue_wait.should_shed(waited_s, settings.WEBHOOK_SHED_AFTER_SECONDS)
        and environ.get("PATH_INFO", "").startswith(WEBHOOK_PATH)
        and "HTTP_X_INTERNAL_WEBHOOK_SECRET" not in environ
    )


class InternalWSGIHandler(WSGIHandler):
    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:  # WSGI: an iterable of bytes
        # Before Django builds a request: a shed webhook costs the pool next to nothing.
        if sheds(environ, queue_wait.waited()):
            metrics.evolution("webhook:shed")
            start_response("503 Service Unavailable", list(_SHED_HEADERS))
            return [_SHED_BODY]
        return super().__call__(environ, start_response)

    def load_middleware(self, is_async: bool = False) -> None:
        # What BaseHandler.load_middleware builds for MIDDLEWARE = [JsonErrorMiddleware], without
        # reading settings.MIDDLEWARE (the full app's list). tests/pilot_status/test_internal_app.py
        # checks the result, so a Django that builds its chain differently fails there first.
        from .middleware import JsonErrorMiddleware

        if is_async:
            raise NotImplementedError("the internal app is served by WSGI only")
        view_chain: Any = convert_exception_to_response(self._get_response)  # type: ignore[attr-defined]
        json_errors = JsonErrorMiddleware(view_chain)
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware = [json_errors.process_exception]
        self._middleware_chain = convert_exception_to_response(json_errors)

    def get_response(self, request: HttpRequest) -> HttpResponseBase:
        request.urlconf = URLCONF  # type: ignore[attr-defined]  # read by BaseHandler.resolve_request
        return super().get_response(request)


def get_internal_application() -> InternalWSGIHandler:
    django.setup(set_prefix=False)
    return InternalWSGIHandler()


os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pilot_status.settings")
application = get_internal_application()
