"""Who may post events: Evolution (per instance) and our own forwarding processes (contract §6).

Instance auth material (name, token salt, Evolution token hash) is cached per process for
`AUTH_CACHE_SECONDS`, so a receipt storm does not cost a SELECT per webhook. What that changes:
- a credential that fails against the cached copy is checked once more against a fresh read, so a
  new (re-keyed) token or a newly added instance works at once;
- an old token keeps working for at most `AUTH_CACHE_SECONDS` after a re-key (as does a deleted
  instance's; its events then find no instance in the handler and change nothing);
- an unknown instance name is remembered for `UNKNOWN_CACHE_SECONDS` only, so that a flood of
  webhooks naming no instance costs Postgres one read per name and second, not one per request;
  an instance added in this process is known at once (its save clears the entry), one added by
  another process within that second.
"""

from __future__ import annotations

import hmac
import threading
import time
from typing import Any

import jwt
from django.conf import settings
from django.http import HttpRequest

from messaging.models import Instance

INTERNAL_SECRET_HEADER = "HTTP_X_INTERNAL_WEBHOOK_SECRET"
AUTH_CACHE_SECONDS = 5.0
UNKNOWN_CACHE_SECONDS = 1.0
_CACHE_MAX = 10_000  # names in each cache; past it that cache starts over (bounded memory)

_cache: dict[str, tuple[float, Instance]] = {}
_unknown: dict[str, float] = {}  # names read and not found, and when
_cache_lock = threading.Lock()  # gthread workers: one writer at a time (reads need none)


def is_internal(request: HttpRequest) -> bool:
    given = request.META.get(INTERNAL_SECRET_HEADER, "")
    return bool(given) and hmac.compare_digest(given.encode(), settings.INTERNAL_WEBHOOK_SECRET.encode())


def authenticate_evolution(request: HttpRequest, payload: dict[str, Any]) -> Instance | None:
    """The instance the event claims to come from, if any one of Evolution's schemes proves it."""
    name = payload.get("instance")
    if not isinstance(name, str) or not name:
        return None
    cached = _cached(name)
    if cached is not None and _proves(request, payload, cached):
        return cached
    if cached is None and _known_unknown(name):
        return None
    # Not cached, or refused by a copy up to AUTH_CACHE_SECONDS old (the token may have just been
    # re-keyed): the database decides.
    instance = _read(name)
    if instance is not None and _proves(request, payload, instance):
        return instance
    return None


def forget_cached_instances() -> None:
    """Drop the cache (tests; an operator command could call it after a re-key)."""
    with _cache_lock:
        _cache.clear()
        _unknown.clear()


def on_instance_changed(sender: Any, instance: Instance, **kwargs: Any) -> None:
    with _cache_lock:
        _cache.pop(instance.name, None)
        _unknown.pop(instance.name, None)


def _cached(name: str) -> Instance | None:
    hit = _cache.get(name)
    if hit is None or time.monotonic() - hit[0] >= AUTH_CACHE_SECONDS:
        return None
    return hit[1]


def _known_unknown(name: str) -> bool:
    at = _unknown.get(name)
    return at is not None and time.monotonic() - at < UNKNOWN_CACHE_SECONDS


def _read(name: str) -> Instance | None:
    instance = Instance.objects.filter(name=name).first()
    with _cache_lock:
        if instance is None:
            _cache.pop(name, None)
            if len(_unknown) >= _CACHE_MAX:
                _unknown.clear()
            _unknown[name] = time.monotonic()
        else:
            _unknown.pop(name, None)
            if len(_cache) >= _CACHE_MAX:
                _cache.clear()
            _cache[name] = (time.monotonic(), instance)
    return instance


def _proves(request: HttpRequest, payload: dict[str, Any], instance: Instance) -> bool:
    token = request.META.get("HTTP_X_WEBHOOK_TOKEN")
    if token and instance.check_webhook_token(token):
        return True
    authorization = request.META.get("HTTP_AUTHORIZATION", "")
    if authorization.startswith("Bearer ") and _valid_jwt(authorization[7:], instance):
        return True
    apikey = payload.get("apikey")
    return isinstance(apikey, str) and bool(apikey) and instance.check_evolution_token(apikey)


def _valid_jwt(token: str, instance: Instance) -> bool:
    # Evolution's jwt_key scheme: HS256, {iat, exp: iat+600, app: "evolution", action: "webhook"},
    # signed with the jwt_key we gave it, which is the instance's webhook token.
    try:
        claims = jwt.decode(token, instance.webhook_token, algorithms=["HS256"], options={"require": ["exp"]})
    except jwt.PyJWTError:
        return False
    return claims.get("app") == "evolution"
