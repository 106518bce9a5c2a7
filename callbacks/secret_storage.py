"""Endpoint signing secrets at rest (issue 45 §6): the database holds each secret as a Fernet token, under a
key kept outside it, so a copy of the database (a dump, a backup, a replica's disk) cannot sign a callback.

The keys: `ENDPOINT_SECRET_KEYS` (Fernet keys, newest first), then one derived from `SECRET_KEY` (HKDF-SHA256
with a label of its own, so it is no key Django uses) and from each of Django's `SECRET_KEY_FALLBACKS`. The
first encrypts; every one decrypts (MultiFernet), so a key being rotated out still reads what it wrote until
`rotate_endpoint_secrets_key` has re-encrypted every secret under the first. Without ENDPOINT_SECRET_KEYS the
derived key encrypts: production mode already requires a strong SECRET_KEY, which never sits in the database.
"""

from __future__ import annotations

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

_LABEL = b"pilot-status endpoint signing secrets v1"


class SecretUnreadable(Exception):
    """No configured key decrypts this secret (its key was dropped from ENDPOINT_SECRET_KEYS, or SECRET_KEY
    changed without SECRET_KEY_FALLBACKS)."""


def derived_key(secret_key: str) -> bytes:
    material = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LABEL).derive(secret_key.encode())
    return base64.urlsafe_b64encode(material)


@functools.lru_cache(maxsize=8)
def _keys(explicit: tuple[str, ...], secret_key: str, fallbacks: tuple[str, ...]) -> MultiFernet:
    derived = [derived_key(key) for key in (secret_key, *fallbacks)]
    return MultiFernet([Fernet(key) for key in (*(k.encode() for k in explicit), *derived)])


def keys() -> MultiFernet:
    return _keys(tuple(settings.ENDPOINT_SECRET_KEYS), settings.SECRET_KEY,
                 tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())))


def encrypt(secret: str) -> str:
    return keys().encrypt(secret.encode()).decode("ascii")


def decrypt(token: str) -> str:
    try:
        return keys().decrypt(token.encode("ascii")).decode()
    except (InvalidToken, UnicodeEncodeError) as exc:
        raise SecretUnreadable("no key in ENDPOINT_SECRET_KEYS (nor one derived from SECRET_KEY) decrypts "
                               "this endpoint's signing secret") from exc


def reencrypt(token: str) -> str:
    """The same secret under the first key (a fresh token even when it already was)."""
    try:
        return keys().rotate(token.encode("ascii")).decode("ascii")
    except (InvalidToken, UnicodeEncodeError) as exc:
        raise SecretUnreadable(str(exc)) from exc


def rotate_all(batch: int = 500) -> dict[str, object]:
    """Re-encrypt every endpoint's secret under the first key (`manage.py rotate_endpoint_secrets_key`), a
    batch of rows per transaction, each row locked while it is rewritten. A secret no key reads is left as
    it is and named: drop no old key until this names none. Safe to run again at any time."""
    from django.db import transaction

    from .models import WebhookEndpoint

    rotated, unreadable = 0, []
    ids = list(WebhookEndpoint.objects.order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(ids), batch):
        with transaction.atomic():
            rows = WebhookEndpoint.objects.select_for_update().filter(pk__in=ids[start:start + batch]).order_by("pk")
            for pk, token in rows.values_list("pk", "encrypted_secret"):
                try:
                    fresh = reencrypt(token)
                except SecretUnreadable:
                    unreadable.append(str(pk))
                    continue
                WebhookEndpoint.objects.filter(pk=pk).update(encrypted_secret=fresh)
                rotated += 1
    return {"rotated": rotated, "unreadable": unreadable}
