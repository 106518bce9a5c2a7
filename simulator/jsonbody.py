"""Request-body parsing the way Express' ``bodyParser.json()`` does it.

body-parser only parses ``application/json`` bodies (anything else leaves ``req.body = {}``),
runs in strict mode (the text must start with ``{`` or ``[``) and reports failures as a
400 whose ``error`` is "Internal Server Error" and whose message is V8's JSON.parse text.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .errors import Halt, js_error


def _no_constants(name: str) -> Any:
    # V8 rejects NaN/Infinity, Python accepts them by default.
    raise ValueError(name)


def _source_excerpt(text: str) -> str:
    # V8 quotes short sources whole and long ones as "...<context>...".
    if len(text) <= 40:
        return f'"{text}"'
    return f'"{text[:30]}"... '.rstrip()


def v8_message(text: str, exc: json.JSONDecodeError | None, pos: int | None = None) -> str:
    if exc is not None:
        pos = exc.pos
        if exc.msg.startswith("Unterminated string"):
            return f"Unterminated string in JSON at position {len(text)}"
        if exc.msg.startswith("Extra data"):
            return f"Unexpected non-whitespace character after JSON at position {pos}"
        if exc.msg.startswith("Invalid control character"):
            return f"Bad control character in string literal in JSON at position {pos}"
    assert pos is not None
    if pos >= len(text.rstrip()):
        return "Unexpected end of JSON input"
    return f"Unexpected token '{text[pos]}', {_source_excerpt(text)} is not valid JSON"


def parse(raw: bytes, content_type: str) -> Any:
    """Return the parsed body or raise :class:`Halt` with Evolution's 400."""
    if content_type != "application/json" or not raw:
        return {}
    text = raw.decode("utf-8", errors="replace")
    stripped = text.lstrip(" \t\r\n")
    if not stripped:
        return {}
    if stripped[0] not in "{[":
        raise Halt(js_error(v8_message(text, None, len(text) - len(stripped)), status=400))
    try:
        return json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise Halt(js_error(v8_message(text, exc), status=400)) from None
    except ValueError:
        raise Halt(js_error("Unexpected token 'N', " + _source_excerpt(text) + " is not valid JSON", status=400)) from None


async def read(request: web.Request) -> Any:
    if not request.body_exists:
        return {}
    return parse(await request.read(), request.content_type)
