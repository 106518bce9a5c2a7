"""Outside DRF (unknown URL, wrong method on a plain view, crash): still the JSON error envelope."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import DatabaseError, DataError
from django.http import HttpRequest, HttpResponse, JsonResponse

from .errors import error_body

log = logging.getLogger(__name__)

JSON_PREFIXES = ("/v1/", "/api/")
_TEXT = {
    400: ("bad_request", "The request could not be understood."),
    403: ("forbidden", "Forbidden."),
    404: ("not_found", "No such resource."),
    405: ("method_not_allowed", "This method is not allowed here."),
    413: ("payload_too_large", "The request body is too large."),
    500: ("internal_error", "Something went wrong on our side; it has been logged."),
}


class JsonErrorMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith(JSON_PREFIXES) or response.status_code < 400:
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        code, message = _TEXT.get(response.status_code, ("error", "Request failed."))
        replaced = JsonResponse(error_body(code, message), status=response.status_code)
        if response.has_header("Allow"):
            replaced["Allow"] = response["Allow"]
        return replaced

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith(JSON_PREFIXES):
            return None
        if isinstance(exception, RequestDataTooBig):
            code, message = _TEXT[413]
            return JsonResponse(error_body(code, message), status=413)
        if isinstance(exception, SuspiciousOperation):
            # Too many fields, a bad multipart body, a disallowed host: the client's request is at
            # fault, and Django itself would answer 400 had this handler not caught it first.
            log.warning("suspicious request on %s: %s", request.path, exception)
            code, message = _TEXT[400]
            return JsonResponse(error_body(code, message), status=400)
        if isinstance(exception, DataError):
            log.warning("value refused by the database on %s: %s", request.path, exception)
            return JsonResponse(error_body("invalid_request", "A value in the request cannot be stored as given."), status=400)
        if isinstance(exception, DatabaseError):
            log.warning("database unavailable: %s", exception)
            response = JsonResponse(error_body("unavailable", "Temporarily unavailable; retry shortly."), status=503)
            response["Retry-After"] = "5"
            return response
        log.exception("unexpected error on %s", request.path, exc_info=exception)
        code, message = _TEXT[500]
        return JsonResponse(error_body(code, message), status=500)
