"""Bearer API keys: `ps_test_…` / `ps_live_…`, looked up by hash (docs/api.md).

Each web process keeps the keys it has seen (with their project) for KEY_CACHE_SECONDS, so a
burst of requests with one key costs one SELECT, not one per request (issue 7, benchmark B1).
The trade-off: a key revoked by another process (the `revoke_key` command, admin in another web
worker) keeps working for reads for at most KEY_CACHE_SECONDS in a process that had it cached (a
send checks the key again, in the funnel's one read or before refusing its body, and answers 401 at
once: messaging.accept), and a
project's `production_approved` / `test_number` change takes as long to apply. Unknown and
revoked keys are never cached: they are looked up every time. `forget_keys()` empties the cache
of the current process.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from ..models import ApiKey
from ..tokens import hash_secret

# Writing last_used_at on every request would double the writes of a send; once a minute is
# precise enough for "is this key still used?".
LAST_USED_RESOLUTION = timedelta(minutes=1)
# Default of settings.API_KEY_CACHE_SECONDS; 0 turns the cache off.
KEY_CACHE_SECONDS = 5.0
_CACHE_LIMIT = 10_000
# What a key can look like (ApiKey.issue: the prefix and token_urlsafe(24), 40 characters; room for
# longer ones). A header of another shape (non-ASCII, NUL, kilobytes long) is a 401 before it is
# hashed or looked up (issue 21).
MAX_API_KEY_LENGTH = 128
KEY_SHAPE = re.compile(r"ps_(?:test|live)_[A-Za-z0-9_-]+")

# key hash → (monotonic time it was read, the key with its project)
_keys: dict[str, tuple[float, ApiKey]] = {}


def forget_keys() -> None:
    """Drop every cached key of this process (the next request reads them again)."""
    _keys.clear()


def _cached(key_hash: str, now: float) -> ApiKey | None:
    ttl = float(getattr(settings, "API_KEY_CACHE_SECONDS", KEY_CACHE_SECONDS))
    hit = _keys.get(key_hash)
    if hit is not None and now - hit[0] < ttl:
        return hit[1]
    key = ApiKey.objects.select_related("project").filter(key_hash=key_hash).first()
    if key is None or not key.is_active or ttl <= 0:
        _keys.pop(key_hash, None)
        return key
    if len(_keys) >= _CACHE_LIMIT:
        _keys.clear()
    _keys[key_hash] = (now, key)
    return key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            raise exceptions.NotAuthenticated("Send your API key as 'Authorization: Bearer ps_…'.")
        scheme, _, raw = header.partition(" ")
        raw = raw.strip()
        # The scheme is case-insensitive (RFC 9110 §11.1); the key itself is not.
        if (scheme.lower() != self.keyword.lower() or len(raw) > MAX_API_KEY_LENGTH
                or KEY_SHAPE.fullmatch(raw) is None):
            raise exceptions.AuthenticationFailed("Malformed API key: expected 'Bearer ps_test_…' or 'Bearer ps_live_…'.")
        key = _cached(hash_secret(raw), time.monotonic())
        if key is None or not key.is_active:
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.")
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
            key.last_used_at = now
        return (None, key)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
