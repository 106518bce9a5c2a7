"""Bearer API keys: `ps_test_…` / `ps_live_…`, looked up by hash (contract §1)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from ..models import ApiKey, hash_secret

# Writing last_used_at on every request would double the writes of a send; once a minute is
# precise enough for "is this key still used?".
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            raise exceptions.NotAuthenticated("Send your API key as 'Authorization: Bearer ps_…'.")
        scheme, _, raw = header.partition(" ")
        raw = raw.strip()
        if scheme != self.keyword or not raw.startswith(("ps_test_", "ps_live_")):
            raise exceptions.AuthenticationFailed("Malformed API key: expected 'Bearer ps_test_…' or 'Bearer ps_live_…'.")
        key = ApiKey.objects.select_related("project").filter(key_hash=hash_secret(raw)).first()
        if key is None or not key.is_active:
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.")
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        return (None, key)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
