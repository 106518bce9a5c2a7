"""HS256 JSON Web Tokens, as Evolution signs them for webhooks whose headers carry ``jwt_key``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def sign(payload: dict[str, Any], key: str) -> str:
    header = _b64url(b'{"alg":"HS256","typ":"JWT"}')
    body = _b64url(json.dumps(payload, separators=(",", ":")).encode())
    signing_input = f"{header}.{body}".encode()
    signature = hmac.new(key.encode(), signing_input, hashlib.sha256).digest()
    return f"{header}.{body}.{_b64url(signature)}"


def webhook_token(key: str) -> str:
    """The token of webhook.controller.ts ``generateJwtToken``: valid for 600 s."""
    iat = int(time.time())
    return sign({"iat": iat, "exp": iat + 600, "app": "evolution", "action": "webhook"}, key)
