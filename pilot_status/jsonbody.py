"""A request body read as JSON within fixed bounds (issue 21: bounded work per request).

`json.loads` alone accepts what the rest of the code cannot handle: nesting deep enough to make
any recursive walk (a validator, `json.dumps`, the template renderer) raise RecursionError, integers
of thousands of digits, and `NaN`/`Infinity`, which Postgres' jsonb refuses. Every endpoint that
reads a body (the client API's parser, Evolution's webhook, the internal forward) goes through
`loads`, so each of these is a 400 naming the problem before any per-request state is kept.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32  # objects and arrays inside each other; Evolution's events nest about 6 deep
MAX_NUMBER_CHARACTERS = 40  # an integer or a decimal as written, sign and exponent included


class JsonBodyError(ValueError):
    """The body is not JSON we take. `reason` is the human text of the error envelope."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _number(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARACTERS:
        raise JsonBodyError(f"A number is longer than {MAX_NUMBER_CHARACTERS} characters.")
    value = float(text)
    if not math.isfinite(value):
        raise JsonBodyError("A number is out of range.")
    return value


def _integer(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARACTERS:
        raise JsonBodyError(f"A number is longer than {MAX_NUMBER_CHARACTERS} characters.")
    return int(text)


def _constant(name: str) -> Any:
    raise JsonBodyError(f"{name} is not JSON.")


def loads(raw: bytes | str) -> Any:
    """The parsed body, or JsonBodyError: not UTF-8 JSON, nested deeper than MAX_DEPTH, a number
    longer than MAX_NUMBER_CHARACTERS or out of range, NaN/Infinity."""
    try:
        value = json.loads(raw, parse_float=_number, parse_int=_integer, parse_constant=_constant)
    except JsonBodyError:
        raise
    except RecursionError as exc:
        raise JsonBodyError(f"JSON nested deeper than {MAX_DEPTH} levels.") from exc
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise JsonBodyError(f"The body is not valid JSON: {exc}") from exc
    if depth_exceeds(value, MAX_DEPTH):
        raise JsonBodyError(f"JSON nested deeper than {MAX_DEPTH} levels.")
    return value


def depth_exceeds(value: Any, limit: int) -> bool:
    """Whether `value` nests objects/arrays more than `limit` deep (iterative: no recursion to blow)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
