"""The one exception a domain rule raises to refuse a request; the API renders it (contract §3)."""

from __future__ import annotations

from typing import Any


class Rejected(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}

    def as_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}
