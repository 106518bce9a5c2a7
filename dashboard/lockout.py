"""Sign-in throttling with django-axes (issue 21): the lockout page, and what a sign-in is counted under.

settings.py wires these in (AXES_LOCKOUT_CALLABLE, AXES_USERNAME_CALLABLE, AXES_CLIENT_IP_CALLABLE,
AXES_HANDLER). Axes writes what it counts to Postgres, so each value here is made storable first: a
malformed sign-in is a failed sign-in, never a 500.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

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
    """REMOTE_ADDR when it is an IP address (a unix socket or a test has none): axes stores it as one."""
    raw = request.META.get("REMOTE_ADDR") or ""
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        return None


class StorableAttempts(AxesDatabaseHandler):  # type: ignore[misc]  # axes ships no types
    """Axes' database handler, with the request's headers made storable (Postgres text holds no NUL)."""

    def user_login_failed(self, sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
        if request is not None:
            for name in ("axes_user_agent", "axes_http_accept", "axes_path_info"):
                value = getattr(request, name, None)
                if isinstance(value, str):
                    setattr(request, name, value.replace("\x00", ""))
        super().user_login_failed(sender, credentials, request, **kwargs)
