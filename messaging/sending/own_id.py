"""The WhatsApp id a message's sends carry (Evolution's `messageId`, issue 48).

Drawn here in the format of Baileys' generateMessageIDV2, the ids Evolution gives its own sends: "3EB0" and 18
uppercase hex digits (22 characters). WhatsApp and Evolution read a message's device from its id (Baileys'
getDevice: "3E" and 20 more characters is `web`, Evolution's `source`), so a send with our id looks like any
other send of Evolution's. 72 random bits, drawn locally: no round trip to Evolution's generateMessageID per
message, and the id exists before the first attempt, even while Evolution is down.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

PREFIX = "3EB0"
_BAILEYS = re.compile(r"3EB0[0-9A-F]{18}\Z")


def new() -> str:
    return PREFIX + secrets.token_hex(9).upper()


def baileys_shaped(key_id: Any) -> bool:
    """Whether an id has the shape Baileys gives the messages Evolution sends (a phone's never does)."""
    return isinstance(key_id, str) and bool(_BAILEYS.match(key_id))
