"""Identifiers and jids in the formats Evolution and Baileys produce."""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import time
import uuid
from typing import Any

_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_STRIP = str.maketrans("", "", "+ ()-")


def message_id() -> str:
    """Baileys ``generateMessageIDV2``: "3EB0" + 18 uppercase hex (22 chars).

    The 3E prefix is what Baileys' ``getDevice`` maps to ``source: "web"``.
    """
    return "3EB0" + os.urandom(9).hex().upper()


# Baileys getDevice (src/Utils/messages.ts): the device a message id says it came from. JavaScript's `$`
# without the m flag is the end of the string, hence \Z here.
_DEVICE_PATTERNS = (("ios", re.compile(r"3A.{18}\Z")), ("web", re.compile(r"3E.{20}\Z")),
                    ("android", re.compile(r"(?:.{21}|.{32})\Z")), ("desktop", re.compile(r"3F|.{18}\Z")))
DEVICES = ("android", "ios", "web", "desktop")


def device_of(key_id: Any) -> str:
    """Evolution's `source` for a message id (prepareMessage: getDevice(key.id)); "unknown" otherwise."""
    if isinstance(key_id, str):
        for device, pattern in _DEVICE_PATTERNS:
            if pattern.match(key_id):
                return device
    return "unknown"


def device_message_id(device: str) -> str:
    """A message id in the format `device` gives its messages (Baileys' getDevice reads it back)."""
    if device == "ios":
        return "3A" + os.urandom(9).hex().upper()  # 20 characters
    if device == "android":
        return os.urandom(16).hex().upper()  # 32 characters
    if device == "desktop":
        return "3F" + os.urandom(9).hex().upper()  # 20 characters, "3F" first
    return message_id()  # web: WhatsApp Web, or another Baileys integration linked to the number


def _b36(n: int, width: int) -> str:
    digits = []
    while n:
        n, r = divmod(n, 36)
        digits.append(_B36[r])
    text = "".join(reversed(digits)) or "0"
    return text.rjust(width, "0")[-width:]


_counter = itertools.count(int.from_bytes(os.urandom(2), "big"))
_FINGERPRINT = _b36(int.from_bytes(hashlib.sha1(str(os.getpid()).encode()).digest()[:4], "big"), 4)


def cuid() -> str:
    """A Prisma ``cuid()``-like row id: 25 chars, starting with "c".

    Layout like cuid v1: timestamp(8) + counter(4) + fingerprint(4) + random(8).
    """
    return (
        "c"
        + _b36(int(time.time() * 1000), 8)
        + _b36(next(_counter) % 36**4, 4)
        + _FINGERPRINT
        + _b36(int.from_bytes(os.urandom(6), "big"), 8)
    )


def instance_uuid() -> str:
    return str(uuid.uuid4())


def instance_token() -> str:
    # Evolution uses an uppercase UUIDv4 when /instance/create gets no token.
    return str(uuid.uuid4()).upper()


def default_owner_jid(name: str) -> str:
    """A stable São Paulo mobile jid for an instance: "55119" + 8 digits from its name."""
    digits = int(hashlib.sha1(name.encode()).hexdigest(), 16) % 10**8
    return f"55119{digits:08d}@s.whatsapp.net"


def clean_number(raw: str) -> str:
    """Strip what Evolution strips from a number: +, spaces, parentheses, dashes."""
    return raw.translate(_STRIP)


def digits_of(raw: str) -> str:
    return "".join(ch for ch in raw if ch.isdigit())


def _mx_ar(number: str) -> str:
    # createJid: Mexico (52) and Argentina (54) 13-digit numbers lose their 3rd digit.
    if number[:2] in ("52", "54") and len(number) == 13:
        return number[:2] + number[3:]
    return number


def _br(number: str) -> str:
    # createJid formatBRNumber: 13-digit 55 numbers drop the 9th digit when the DDD is
    # >= 31 and the first of the last 8 digits is >= 7 (WhatsApp's canonical jid).
    if len(number) == 13 and number.isdigit() and number.startswith("55"):
        ddd = int(number[2:4])
        joker = int(number[5])
        if ddd >= 31 and joker >= 7:
            return number[:4] + number[5:]
    return number


def create_jid(raw: str) -> str:
    """Evolution ``createJid`` (src/utils/createJid.ts), cheap subset."""
    if any(s in raw for s in ("@g.us", "@s.whatsapp.net", "@lid", "@broadcast")):
        user, _, server = raw.partition("@")
        return user.split(":")[0] + "@" + server
    number = clean_number(raw).split(":")[0].split("@")[0]
    number = digits_of(number)
    if len(number) >= 18:
        return number + "@g.us"
    return _br(_mx_ar(number)) + "@s.whatsapp.net"


def is_group(jid: str) -> bool:
    return jid.endswith("@g.us")


def js_truthy(value: Any) -> bool:
    """JavaScript truthiness of a JSON value: Evolution's `if (messageId)` (empty lists and objects are true)."""
    if value is None or value is False or value == "":
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0 and value == value  # 0 and NaN are false
    return True
