"""Secrets and tokens: API key and Evolution token hashes, and the instances' derived webhook tokens.

Shared by the models (ApiKey, Instance) and the webhook's cached credentials (ingestion.auth), which check
an instance's tokens without its row.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets

from django.conf import settings


def hash_secret(raw: str) -> str:
    # API keys and tokens are long random strings: a fast hash is enough and keeps lookups O(1).
    return hashlib.sha256(raw.encode()).hexdigest()


def new_token_salt() -> str:
    """An instance's webhook token salt: 128 random bits, drawn when the instance is made (or re-keyed).

    With an empty or guessable salt the token would follow from SECRET_KEY and the instance's name
    alone, the same for every deployment that shares a key.
    """
    return secrets.token_hex(16)


@functools.lru_cache(maxsize=4096)
def _derived_webhook_token(secret_key: str, name: str, salt: str) -> str:
    # Checked on every webhook: derived once per instance and salt (a re-key changes the salt).
    material = f"webhook-token:{name}:{salt}".encode()
    return hmac.new(secret_key.encode(), material, hashlib.sha256).hexdigest()


def webhook_token_for(name: str, token_salt: str) -> str:
    """The webhook token of the instance with this name and salt (x-webhook-token, the JWT's key)."""
    return _derived_webhook_token(settings.SECRET_KEY, name, token_salt)


# The two token checks, shared by Instance and the webhook's cached credentials (ingestion.auth), so
# that there is one implementation of each to keep constant-time and strict.
def webhook_token_matches(name: str, token_salt: str, candidate: str) -> bool:
    # Constant time, on bytes: a non-ASCII or lone-surrogate header is a wrong token, not a
    # TypeError from compare_digest.
    return hmac.compare_digest(webhook_token_for(name, token_salt).encode(), candidate.encode("utf-8", "surrogatepass"))


def evolution_token_matches(evolution_token_hash: str, candidate: str) -> bool:
    if not evolution_token_hash:
        return False  # no Evolution token was ever given: none proves anything
    return hmac.compare_digest(evolution_token_hash, hash_secret(candidate))


class InstanceTokens:
    """An instance's token checks, for anything that carries its name, token_salt and evolution_token_hash: the
    Instance row, or the webhook's cached credentials (ingestion.auth.InstanceCredentials)."""

    __slots__ = ()
    name: str
    token_salt: str
    evolution_token_hash: str

    @property
    def webhook_token(self) -> str:
        return webhook_token_for(self.name, self.token_salt)

    def check_webhook_token(self, candidate: str) -> bool:
        return webhook_token_matches(self.name, self.token_salt, candidate)

    def check_evolution_token(self, candidate: str) -> bool:
        return evolution_token_matches(self.evolution_token_hash, candidate)
