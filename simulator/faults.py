"""Per-instance fault injection settings and the decisions drawn from them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from . import errors
from .ids import digits_of

_RATES = ("error_rate", "hang_rate", "webhook_drop_rate", "webhook_duplicate_rate",
          "rabbitmq_drop_rate", "rabbitmq_duplicate_rate", "lose_answer_before_rate", "lose_answer_after_rate",
          "never_ack_rate")
_NUMBERS = ("latency_ms", "send_latency_ms", "hang_ms")


@dataclass(slots=True)
class Faults:
    error_rate: float = 0.0
    error_status: int = 500
    error_body: Any = None
    error_sequence: list[int] = field(default_factory=list)
    latency_ms: float = 0.0
    # sendText only, once the message is on its way: real Evolution answers it when WhatsApp took the
    # message (0.3-3 s), while connectionState and the chat look-ups answer from memory at once.
    send_latency_ms: float = 0.0
    hang_rate: float = 0.0
    hang_ms: float = 60000.0
    hang_after_send: bool = False
    # Answers lost for good (the caller's read timeout passes, hang_ms later an error comes): before
    # anything is sent, or after the message reached WhatsApp. One draw per call, so the two rates add.
    lose_answer_before_rate: float = 0.0
    lose_answer_after_rate: float = 0.0
    # WhatsApp takes the message (201 PENDING, send.message) and never acknowledges it: no receipt at all,
    # the instance still connected (evolution-api #1938, #2597).
    never_ack_rate: float = 0.0
    not_on_whatsapp: list[str] = field(default_factory=list)
    number_cached: bool = False
    ack_delays_ms: dict[str, float | None] = field(default_factory=dict)
    webhook_drop_rate: float = 0.0
    webhook_duplicate_rate: float = 0.0
    rabbitmq_drop_rate: float = 0.0
    rabbitmq_duplicate_rate: float = 0.0
    # digits-only copy of not_on_whatsapp for the hot path
    absent: frozenset[str] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__ if name != "absent"}

    def merge(self, patch: dict[str, Any]) -> None:
        """Merge a control-API patch; raise ValueError naming the bad field."""
        if not isinstance(patch, dict):
            raise ValueError("faults must be an object")
        for name, value in patch.items():
            if name in _RATES:
                if not _is_number(value) or not 0 <= value <= 1:
                    raise ValueError(f"faults.{name} must be a number between 0 and 1")
                setattr(self, name, float(value))
            elif name in _NUMBERS:
                if not _is_number(value) or value < 0:
                    raise ValueError(f"faults.{name} must be a number >= 0")
                setattr(self, name, float(value))
            elif name == "error_status":
                if not isinstance(value, int) or isinstance(value, bool) or not 100 <= value <= 599:
                    raise ValueError("faults.error_status must be an HTTP status code")
                self.error_status = value
            elif name == "error_body":
                self.error_body = value
            elif name == "error_sequence":
                if not isinstance(value, list) or not all(isinstance(v, int) and 100 <= v <= 599 for v in value):
                    raise ValueError("faults.error_sequence must be a list of HTTP status codes")
                self.error_sequence = list(value)
            elif name in ("hang_after_send", "number_cached"):
                if not isinstance(value, bool):
                    raise ValueError(f"faults.{name} must be a boolean")
                setattr(self, name, value)
            elif name == "not_on_whatsapp":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError("faults.not_on_whatsapp must be a list of strings")
                self.not_on_whatsapp = list(value)
                self.absent = frozenset(digits_of(v) for v in value)
            elif name == "ack_delays_ms":
                if not isinstance(value, dict) or not all(v is None or (_is_number(v) and v >= 0) for v in value.values()):
                    raise ValueError("faults.ack_delays_ms must map statuses to milliseconds or null")
                self.ack_delays_ms.update(value)
            else:
                raise ValueError(f"unknown fault {name!r}")

    def injected_error(self) -> int | None:
        """The status of an injected sendText error for this call, or None to answer normally."""
        if self.error_sequence:
            status = self.error_sequence.pop(0)
            return status if status >= 300 else None
        if self.error_rate and random.random() < self.error_rate:
            return self.error_status
        return None

    def error_response_body(self, status: int) -> Any:
        return self.error_body if self.error_body is not None else errors.generic(status)

    def hangs(self) -> bool:
        return bool(self.hang_rate) and random.random() < self.hang_rate

    def lost_answer(self) -> str | None:
        """"before" or "after" when this call's answer is to be lost (lose_answer_*_rate), else None."""
        if not (self.lose_answer_before_rate or self.lose_answer_after_rate):
            return None
        draw = random.random()
        if draw < self.lose_answer_after_rate:
            return "after"
        if draw < self.lose_answer_after_rate + self.lose_answer_before_rate:
            return "before"
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def roll(rate: float) -> bool:
    return bool(rate) and random.random() < rate
