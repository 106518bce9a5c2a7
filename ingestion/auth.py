"""Who may post events: Evolution (per instance) and our own forwarding processes (docs/security.md, "Evolution's webhook and the internal forward").

Instance auth material (name, token salt, Evolution token hash) is cached per process for
`AUTH_CACHE_SECONDS`, so a receipt storm does not cost a SELECT per webhook. It is read by one fixed,
prepared statement into a small immutable `InstanceCredentials`, whose token checks are Instance's own.
What the cache changes:
- a credential that fails against the cached copy is checked once more against a fresh read, so a
  new (re-keyed) token or a newly added instance works at once;
- an old token keeps working for at most `AUTH_CACHE_SECONDS` after a re-key (as does a deleted
  instance's; its events then find no instance in the handler and change nothing);
- an unknown instance name is remembered for `UNKNOWN_CACHE_SECONDS` only, so that a flood of
  webhooks naming no instance costs Postgres one read per name and second, not one per request;
  an instance added in this process is known at once (its save clears the entry), one added by
  another process within that second.

Bounded work for callers we do not know (issue 21): a name that cannot be an instance's (not a
string, longer than the model's `name`, NUL, a lone surrogate, a control character) and a
credential that cannot be one (not printable ASCII, longer than its bound) are refused before any
lookup or caching. Only a body shaped like an Evolution event may leave an unknown name behind,
and both caches are LRUs bounded by entries and by an estimate of their bytes, so no sequence of
unauthenticated requests grows a process past a fixed size.
"""

from __future__ import annotations

import hmac
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import jwt
from django.conf import settings
from django.http import HttpRequest

from messaging.models import Instance
from messaging.prepared import prepared_cursor
from messaging.tokens import InstanceTokens
from pilot_status.database import checking_connection

from . import inbox

INTERNAL_SECRET_HEADER = "HTTP_X_INTERNAL_WEBHOOK_SECRET"
AUTH_CACHE_SECONDS = 5.0
UNKNOWN_CACHE_SECONDS = 1.0

# Bounds on what a caller may hand us as a credential (issue 21). Evolution's instance tokens are
# UUIDs (36 characters), our webhook tokens and the internal secret a few dozen; its jwt_key JWT is
# about 200. Anything longer, or not printable ASCII, proves nothing and is not even compared.
CREDENTIAL_MAX_CHARS = 512  # x-webhook-token, body apikey, x-internal-webhook-secret
JWT_MAX_CHARS = 4096  # Authorization: Bearer <jwt>

# The caches: least recently used entries go first once either bound is reached. An entry's bytes
# are estimated (the name, plus what its value, its timestamp and the LRU's links cost).
KNOWN_MAX_ENTRIES = 2_000
KNOWN_MAX_BYTES = 4 * 1024 * 1024
UNKNOWN_MAX_ENTRIES = 10_000
UNKNOWN_MAX_BYTES = 2 * 1024 * 1024
_KNOWN_ENTRY_OVERHEAD = 512  # InstanceCredentials and its salt, hash and pk, the LRU's link and tuple (measured: ~420)
_UNKNOWN_ENTRY_OVERHEAD = 256  # the LRU's link and dict slot, a (float, None, int) tuple (measured: ~250)

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class InstanceCredentials(InstanceTokens):
    """What proves an event to be an instance's, as read for it: all auth keeps of an instance.

    Small and immutable, so that a cached copy is shared by gthread's threads as it is; the checks
    are Instance's own (messaging.tokens.InstanceTokens), not a second implementation."""

    pk: int
    name: str
    token_salt: str
    evolution_token_hash: str


class _Remembered(Generic[V]):
    """name → (when, value): an LRU bounded by entries and bytes, safe for gthread's threads."""

    def __init__(self, overhead: int) -> None:
        self._entries: OrderedDict[str, tuple[float, V, int]] = OrderedDict()
        self._bytes = 0
        self._overhead = overhead
        self._lock = threading.Lock()

    def get(self, name: str, max_age: float) -> tuple[V] | None:
        """(value,) when remembered for less than max_age seconds; None otherwise."""
        with self._lock:
            hit = self._entries.get(name)
            if hit is None:
                return None
            if time.monotonic() - hit[0] >= max_age:
                self._drop(name)
                return None
            self._entries.move_to_end(name)
            return (hit[1],)

    def put(self, name: str, value: V, max_entries: int, max_bytes: int) -> None:
        size = sys.getsizeof(name) + self._overhead
        if size > max_bytes or max_entries < 1:
            return
        with self._lock:
            self._drop(name)
            while self._entries and (len(self._entries) >= max_entries or self._bytes + size > max_bytes):
                _, (_, _, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted
            self._entries[name] = (time.monotonic(), value, size)
            self._bytes += size

    def pop(self, name: str) -> None:
        with self._lock:
            self._drop(name)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def footprint(self) -> tuple[int, int]:
        return len(self._entries), self._bytes

    def _drop(self, name: str) -> None:
        hit = self._entries.pop(name, None)
        if hit is not None:
            self._bytes -= hit[2]


_known: _Remembered[InstanceCredentials] = _Remembered(_KNOWN_ENTRY_OVERHEAD)
_unknown: _Remembered[None] = _Remembered(_UNKNOWN_ENTRY_OVERHEAD)  # names read and not found


def credential(value: Any, max_chars: int = CREDENTIAL_MAX_CHARS) -> str | None:
    """`value` when it can be a credential (a non-empty printable ASCII string within `max_chars`)."""
    if isinstance(value, str) and 0 < len(value) <= max_chars and value.isascii() and value.isprintable():
        return value
    return None


def is_internal(request: HttpRequest) -> bool:
    given = credential(request.META.get(INTERNAL_SECRET_HEADER))
    return given is not None and hmac.compare_digest(given.encode(), settings.INTERNAL_WEBHOOK_SECRET.encode())


def authenticate_evolution(request: HttpRequest, payload: dict[str, Any]) -> InstanceCredentials | None:
    """The instance the event claims to come from, if any one of Evolution's schemes proves it."""
    name = payload.get("instance")
    if not inbox.instance_name_ok(name):
        return None  # no instance has such a name: nothing is looked up or remembered
    assert isinstance(name, str)
    cached = _known.get(name, AUTH_CACHE_SECONDS)
    if cached is not None and _proves(request, payload, cached[0]):
        return cached[0]
    if cached is None and _unknown.get(name, UNKNOWN_CACHE_SECONDS) is not None:
        return None
    # Not cached, or refused by a copy up to AUTH_CACHE_SECONDS old (the token may have just been
    # re-keyed): the database decides. Only an Evolution-shaped body may leave its name behind.
    credentials = _read(name, remember_unknown=inbox.is_evolution_event(payload))
    if credentials is not None and _proves(request, payload, credentials):
        return credentials
    return None


def cache_footprint() -> tuple[int, int]:
    """(entries, estimated bytes) of both caches together (tests, and a bound to assert)."""
    known, unknown = _known.footprint(), _unknown.footprint()
    return known[0] + unknown[0], known[1] + unknown[1]


def forget_cached_instances() -> None:
    """Drop the cache (tests; an operator command could call it after a re-key)."""
    _known.clear()
    _unknown.clear()


def on_instance_changed(sender: Any, instance: Instance, **kwargs: Any) -> None:
    _known.pop(instance.name)
    _unknown.pop(instance.name)


# One fixed statement, prepared on each connection: the columns auth needs and nothing else, no
# ORDER BY (the name is unique). It runs for every webhook whose instance the cache has outlived,
# so an ORM query (compiled each time, all of Instance's columns, a model built) costs too much here.
_CREDENTIALS_SQL = (
    "SELECT id, name, token_salt, evolution_token_hash FROM messaging_instance WHERE name = %s"
)


def _select_credentials(name: str) -> InstanceCredentials | None:
    with prepared_cursor() as cursor:
        cursor.execute(_CREDENTIALS_SQL, (name,))
        row = cursor.fetchone()
    return None if row is None else InstanceCredentials(*row)


def _read(name: str, remember_unknown: bool) -> InstanceCredentials | None:
    # Often a webhook's first statement (the cache outlived, as for a thousand numbers each sending every half minute):
    # it is the connection's health check too, instead of a SELECT 1 before it.
    credentials = checking_connection(lambda: _select_credentials(name))
    if credentials is None:
        _known.pop(name)
        if remember_unknown:
            _unknown.put(name, None, UNKNOWN_MAX_ENTRIES, UNKNOWN_MAX_BYTES)
    else:
        _unknown.pop(name)
        # Keyed by the row's own name string, which the value holds too: one string per entry.
        _known.put(credentials.name, credentials, KNOWN_MAX_ENTRIES, KNOWN_MAX_BYTES)
    return credentials


def _proves(request: HttpRequest, payload: dict[str, Any], instance: InstanceCredentials) -> bool:
    token = credential(request.META.get("HTTP_X_WEBHOOK_TOKEN"))
    if token is not None and instance.check_webhook_token(token):
        return True
    authorization = request.META.get("HTTP_AUTHORIZATION")
    if isinstance(authorization, str) and authorization.startswith("Bearer "):
        bearer = credential(authorization[7:], JWT_MAX_CHARS)
        if bearer is not None and _valid_jwt(bearer, instance):
            return True
    apikey = credential(payload.get("apikey"))
    return apikey is not None and instance.check_evolution_token(apikey)


def _valid_jwt(token: str, instance: InstanceCredentials) -> bool:
    # Evolution's jwt_key scheme: HS256, {iat, exp: iat+600, app: "evolution", action: "webhook"},
    # signed with the jwt_key we gave it, which is the instance's webhook token.
    try:
        claims = jwt.decode(token, instance.webhook_token, algorithms=["HS256"], options={"require": ["exp"]})
    except jwt.PyJWTError:
        return False
    return isinstance(claims, dict) and claims.get("app") == "evolution"
