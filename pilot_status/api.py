"""DRF base settings for every client endpoint, and the one exception handler (docs/api.md)."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation, TooManyFieldsSent
from django.db import DatabaseError, DataError
from django.conf import settings
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from messaging.api.authentication import ApiKeyAuthentication
from messaging.api.permissions import HasProject
from messaging.api.throttling import ApiKeyRateThrottle
from messaging.errors import Rejected

from .errors import error_body

log = logging.getLogger(__name__)

_CODES: list[tuple[type[Exception], str]] = [
    (exceptions.NotAuthenticated, "unauthorized"),
    (exceptions.AuthenticationFailed, "unauthorized"),
    (exceptions.Throttled, "rate_limited"),
    (exceptions.UnsupportedMediaType, "unsupported_media_type"),
    (exceptions.ParseError, "invalid_json"),
    (exceptions.ValidationError, "invalid_request"),
    (exceptions.NotFound, "not_found"),
    (exceptions.MethodNotAllowed, "method_not_allowed"),
    (exceptions.PermissionDenied, "forbidden"),
    (exceptions.NotAcceptable, "not_acceptable"),
]


def _message(exc: exceptions.APIException) -> str:
    if isinstance(exc, exceptions.ValidationError):
        return "The request body is not valid; see details.fields."
    if isinstance(exc, exceptions.Throttled):
        return "Too many requests for this API key; retry after the Retry-After seconds."
    detail = exc.detail
    return str(detail) if not isinstance(detail, (list, dict)) else str(exc.default_detail)


def _encodable(detail: Any) -> Any:
    """DRF echoes some input in its errors (an unknown field's name, a choice that is not one). The
    renderer writes UTF-8, which a lone surrogate (`"\\ud800"` in the body) cannot be: a 500. Such
    text is shown escaped instead; everything else is returned as it is."""
    if isinstance(detail, str):
        try:
            detail.encode()
        except UnicodeEncodeError:
            return detail.encode("utf-8", "backslashreplace").decode()
        return detail
    if isinstance(detail, dict):
        return {_encodable(key): _encodable(value) for key, value in detail.items()}
    if isinstance(detail, list):
        return [_encodable(item) for item in detail]
    return detail


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    if isinstance(exc, Rejected):
        return Response(exc.as_body(), status=exc.status, headers=exc.headers() or None)
    if isinstance(exc, RequestDataTooBig):
        return Response(
            error_body("payload_too_large", "The request body is too large.", {"limitBytes": settings.DATA_UPLOAD_MAX_MEMORY_SIZE}),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, TooManyFieldsSent):
        # More query parameters than DATA_UPLOAD_MAX_NUMBER_FIELDS: Django stops parsing them.
        return Response(
            error_body("invalid_request", "Too many query parameters.", {"limit": settings.DATA_UPLOAD_MAX_NUMBER_FIELDS}),
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, SuspiciousOperation):
        # Django's own answer to a request it refuses to read (it would be a 400 outside DRF too).
        return Response(error_body("invalid_request", "The request could not be understood."), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, DataError):
        # Postgres refused a value (NUL, bad encoding, out of range): the input is at fault, and a
        # 503 would invite the client to retry the same request forever.
        log.warning("value refused by the database: %s", exc)
        return Response(
            error_body("invalid_request", "A value in the request cannot be stored as given."),
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, DatabaseError):
        log.warning("database unavailable: %s", exc)
        return Response(
            error_body("unavailable", "The service is temporarily unavailable; retry shortly."),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "5"},
        )
    if isinstance(exc, exceptions.APIException):
        code = next((c for cls, c in _CODES if isinstance(exc, cls)), "error")
        details: dict[str, Any] = {}
        if isinstance(exc, exceptions.ValidationError):
            details = {"fields": _encodable(exc.detail)}
        headers: dict[str, str] = {}
        wait = getattr(exc, "wait", None) if isinstance(exc, exceptions.Throttled) else None
        if wait is not None:
            headers["Retry-After"] = str(int(max(1, wait)))
            details = {"retryAfter": int(max(1, wait))}
        if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
            headers["WWW-Authenticate"] = "Bearer"
            status_code = 401
        else:
            status_code = exc.status_code
        return Response(error_body(code, _message(exc), details), status=status_code, headers=headers)
    log.exception("unexpected error", exc_info=exc)
    return Response(
        error_body("internal_error", "Something went wrong on our side; it has been logged."),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


_JSON = "application/json"
_PLAIN_ACCEPTS = frozenset({"*/*", _JSON})


class ClientApiView(APIView):
    # Auth, throttle and error shape shared by every /v1 endpoint (a comment, not a docstring: drf-spectacular
    # would show a base class's docstring as every endpoint's description).

    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [HasProject]
    throttle_classes = [ApiKeyRateThrottle]

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        # The key answers first (docs/api.md), before DRF's content negotiation: a caller without
        # a valid key learns 401 whatever its Accept header says (the error is JSON either way).
        self.perform_authentication(request)
        super().initial(request, *args, **kwargs)

    def perform_content_negotiation(self, request: Any, force: bool = False) -> Any:
        # DRF parses the Accept header, and builds request.headers from every META key to read
        # it, on each request. With the one JSON renderer, no Accept header, `*/*` or
        # `application/json` (and no ?format=) has one answer, the one DRF would give.
        renderers = self.get_renderers()
        meta = request.META
        if (
            len(renderers) == 1
            and renderers[0].media_type == _JSON
            and not getattr(self, "format_kwarg", None)  # unset when the key failed before initial()
            and not meta.get("QUERY_STRING")
            and meta.get("HTTP_ACCEPT", "*/*") in _PLAIN_ACCEPTS
        ):
            return renderers[0], _JSON
        return super().perform_content_negotiation(request, force)

    @property
    def project(self) -> Any:
        return self.request.auth.project  # type: ignore[union-attr]  # HasProject guarantees an ApiKey

    @property
    def api_key(self) -> Any:
        return self.request.auth

    @property
    def environment(self) -> str:
        """The key's environment: with the project, the scope of everything the key sees and does
        (docs/security.md, the sandbox rule)."""
        return str(self.request.auth.environment)  # type: ignore[union-attr]
