"""Sign-in throttling with django-axes (issue 21): the lockout page, and what a sign-in is counted under.

settings/security.py wires these in (AXES_LOCKOUT_CALLABLE, AXES_USERNAME_CALLABLE, AXES_CLIENT_IP_CALLABLE,
AXES_HANDLER). Axes writes what it counts to Postgres, so each value here is made storable first: a
malformed sign-in is a failed sign-in, never a 500.

Two bounds (issue 45 §5). A (username, client) pair is locked after LOGIN_FAILURE_LIMIT wrong passwords,
the client being the address our trusted proxies vouch for, an IPv6 one by its /64
(pilot_status.client_address). And a username is locked, from everywhere, after
LOGIN_USERNAME_FAILURE_LIMIT wrong passwords from all clients together: high enough that no one hands a
user a lock-out with a few wrong passwords, low enough that guessing from many addresses stays bounded.
Axes counts both (AXES_LOCKOUT_PARAMETERS: the pair, then the username) but compares them with one limit,
so the handler reports them on the pair's scale.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Sum

from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from pilot_status import client_address

# 429: the same "too many requests, come back later" the client API answers for its rate limit.
STATUS = 429


def locked_out(request: HttpRequest, original_response: HttpResponse | None = None,
               credentials: dict[str, Any] | None = None) -> HttpResponse:
    minutes = max(1, round(settings.LOGIN_LOCKOUT_SECONDS / 60))
    body = render_to_string("dashboard/locked_out.html", {
        "failures": settings.LOGIN_FAILURE_LIMIT,
        "minutes": minutes,
        # The sign-in page this came from: the admin's or the dashboard's.
        "retry_url": request.path,
    }, request=request)
    response = HttpResponse(body, status=STATUS)
    response["Retry-After"] = str(settings.LOGIN_LOCKOUT_SECONDS)
    return response


def username_of(request: HttpRequest, credentials: dict[str, Any] | None = None) -> str | None:
    """The username a sign-in is counted under.

    Django's sign-in form checks no length, so a 5,000-character username reaches axes, whose column holds
    255: cut to Django's own 150 (no user has a longer name, so nothing real is merged), NUL dropped.
    """
    raw = credentials.get("username") if credentials else request.POST.get("username")
    return raw.replace("\x00", "")[:150] if isinstance(raw, str) else None


def address_of(request: HttpRequest) -> str | None:
    """The client's address as the lockout counts it (pilot_status.client_address), or None when there is
    none (a unix socket, a test): axes stores it as an IP address."""
    address = client_address.client(request.META)
    return client_address.grouped(address) if address is not None else None


class StorableAttempts(AxesDatabaseHandler):  # type: ignore[misc]  # axes ships no types
    """Axes' database handler, with the request's headers made storable (Postgres text holds no NUL), and the
    username's own bound beside the pair's."""

    def get_failures(self, request: Any, credentials: dict[str, Any] | None = None) -> int:
        # Axes locks at failures >= AXES_FAILURE_LIMIT (the pair's limit): a username past its own, higher
        # limit is reported at the pair's limit.
        pair, username = (
            attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0
            for attempts in self.get_user_attempts(request, credentials)
        )
        if username >= settings.LOGIN_USERNAME_FAILURE_LIMIT:
            return max(int(pair), settings.LOGIN_FAILURE_LIMIT)
        return int(pair)

    def user_login_failed(self, sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
        if request is not None:
            for name in ("axes_user_agent", "axes_http_accept", "axes_path_info"):
                value = getattr(request, name, None)
                if isinstance(value, str):
                    setattr(request, name, value.replace("\x00", ""))
        super().user_login_failed(sender, credentials, request, **kwargs)
