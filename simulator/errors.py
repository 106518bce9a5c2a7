"""The error bodies Evolution's Express error handler produces (src/main.ts, src/exceptions).

Every error body is ``{"status", "error", "response": {"message": X}}``:
- thrown Bad/NotFound/Forbidden/InternalServerError exceptions: X is the array of arguments;
- ``UnauthorizedException()``: X is the string "Unauthorized";
- any other JavaScript error (TypeError, a Baileys Boom, a body-parser error): X is the bare
  ``err.message`` string, and ``error`` is "Internal Server Error" unless the error set one.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from aiohttp import web


def dumps(obj: Any) -> bytes:
    # Compact like JSON.stringify; keep "Você" as UTF-8 rather than \u escapes.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def reply(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=dumps(body), content_type="application/json", charset="utf-8")


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class Halt(Exception):
    """Stop a handler and answer with ``response`` (guards, validation, faults)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def envelope(status: int, error: str, message: Any) -> dict[str, Any]:
    return {"status": status, "error": error, "response": {"message": message}}


def bad_request(*args: Any) -> web.Response:
    return reply(400, envelope(400, "Bad Request", list(args)))


def not_found(*args: Any) -> web.Response:
    return reply(404, envelope(404, "Not Found", list(args)))


def forbidden(*args: Any) -> web.Response:
    return reply(403, envelope(403, "Forbidden", list(args)))


def unauthorized() -> web.Response:
    return reply(401, envelope(401, "Unauthorized", "Unauthorized"))


def js_error(message: str, status: int = 500, error: str = "Internal Server Error") -> web.Response:
    """A plain JavaScript error reaching the global handler: message is a bare string."""
    return reply(status, envelope(status, error, message))


def instance_not_found(name: str) -> web.Response:
    return not_found(f'The "{name}" instance does not exist')


def not_loaded(method: str) -> web.Response:
    # The controller indexes waMonitor.waInstances[name] (undefined) and calls a method on it.
    return js_error(f"Cannot read properties of undefined (reading '{method}')")


def validation_failed(messages: list[str]) -> web.Response:
    # dataValidate throws new BadRequestException(messagesArray): note the nested array.
    return bad_request(messages)


def generic(status: int) -> dict[str, Any]:
    """Default body for an injected error: the generic JS-error envelope."""
    phrase = reason(status)
    return envelope(status, phrase, phrase)
