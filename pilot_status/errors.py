"""The JSON error envelope every endpoint answers with (docs/api.md)."""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def error_response(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> JsonResponse:
    return JsonResponse(error_body(code, message, details), status=status)
