"""The one exception a domain rule raises to refuse a request; the API renders it (docs/api.md)."""

from __future__ import annotations

from typing import Any


class Rejected(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after  # seconds, sent as Retry-After (a 429's)

    def headers(self) -> dict[str, str]:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers

    def as_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}
