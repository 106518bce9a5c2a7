"""The webhook pool's WSGI app: Evolution's webhooks, the consumer's forwards and the counters.

It routes /api/internal/ only (pilot_status.internal_urls; anything else is a 404) through the one
middleware those endpoints need, the JSON error envelope. The browser middleware of the full app
(static files, sessions, CSRF, auth, messages, security headers) does nothing for a webhook but
cost CPU on every request (bench/findings.md, "Webhook pool settings"). The admin and the dashboard are never
served here, so they always keep that middleware (pilot_status.wsgi on `web`).
"""

from __future__ import annotations

import os
from typing import Any

import django
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from pilot_status.collector import freeze_startup_objects

URLCONF = "pilot_status.internal_urls"


class InternalWSGIHandler(WSGIHandler):
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
# Imported by each gunicorn worker once it has forked: what it built so far lives as long as it.
freeze_startup_objects()
