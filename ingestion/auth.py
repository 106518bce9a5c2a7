"""Who may post events: Evolution (per instance) and our own forwarding processes (contract §6)."""

from __future__ import annotations

import hmac
from typing import Any

import jwt
from django.conf import settings
from django.http import HttpRequest

from messaging.models import Instance

INTERNAL_SECRET_HEADER = "HTTP_X_INTERNAL_WEBHOOK_SECRET"


def is_internal(request: HttpRequest) -> bool:
    given = request.META.get(INTERNAL_SECRET_HEADER, "")
    return bool(given) and hmac.compare_digest(given.encode(), settings.INTERNAL_WEBHOOK_SECRET.encode())


def authenticate_evolution(request: HttpRequest, payload: dict[str, Any]) -> Instance | None:
    """The instance the event claims to come from, if any one of Evolution's schemes proves it."""
    instance = Instance.objects.filter(name=payload.get("instance")).first()
    if instance is None:
        return None
    token = request.META.get("HTTP_X_WEBHOOK_TOKEN")
    if token and instance.check_webhook_token(token):
        return instance
    authorization = request.META.get("HTTP_AUTHORIZATION", "")
    if authorization.startswith("Bearer ") and _valid_jwt(authorization[7:], instance):
        return instance
    apikey = payload.get("apikey")
    if isinstance(apikey, str) and apikey and instance.check_evolution_token(apikey):
        return instance
    return None


def _valid_jwt(token: str, instance: Instance) -> bool:
    # Evolution's jwt_key scheme: HS256, {iat, exp: iat+600, app: "evolution", action: "webhook"},
    # signed with the jwt_key we gave it, which is the instance's webhook token.
    try:
        claims = jwt.decode(token, instance.webhook_token, algorithms=["HS256"], options={"require": ["exp"]})
    except jwt.PyJWTError:
        return False
    return claims.get("app") == "evolution"
