"""The typing simulation: how long Evolution shows "typing…" before it sends (its `delay`, in ms).

The worker simulates a human typing before every send. Evolution does it when sendText
carries a `delay`: presence `composing`, a sleep of `delay` ms, presence `paused`, then the message,
and the HTTP answer waits for all of it (docs/evolution-setup.md, "sendText and its delay").

A human-like default, per message (`typing`: `auto`, or `off` for none):
- UTILITY and MARKETING: `TYPING_DELAY_MS_PER_CHAR` (30 ms) per character of the rendered text, a
  fast typist's pace: a 60-character notice types for about 1.8 s;
- OTP: a short fixed `TYPING_DELAY_OTP_MS` (300 ms): a code is awaited, not read as a chat;
- both varied by ±`TYPING_DELAY_JITTER` (20 %), so that a batch does not type in lockstep;
- and never more than `TYPING_DELAY_MAX_MS` (3 s) after the jitter: the bound that the send lease
  (sending.budget) and the read timeout (sending.gateway) count on.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from django.conf import settings

from ..models import Category, Message, Typing


def delay_ms(
    text: str, category: str, typing: str, *, per_char_ms: int, otp_ms: int, max_ms: int, jitter: float,
    draw: Callable[[], float] = random.random,
) -> int:
    """The typing delay for one send; 0 when typing is off (by the message or by the settings)."""
    if typing == Typing.OFF:
        return 0
    base = otp_ms if category == Category.OTP else len(text) * per_char_ms
    if base <= 0 or max_ms <= 0:
        return 0
    varied = base * (1 + jitter * (2 * draw() - 1))
    return int(min(max(varied, 0), max_ms))


def delay_ms_for(message: Message) -> int:
    return delay_ms(
        message.text, message.category, message.typing,
        per_char_ms=settings.TYPING_DELAY_MS_PER_CHAR, otp_ms=settings.TYPING_DELAY_OTP_MS,
        max_ms=settings.TYPING_DELAY_MAX_MS, jitter=settings.TYPING_DELAY_JITTER,
    )
