"""The dashboard's mode: the one environment a member sees at a time (the sandbox rule, docs/security.md).

LIVE by default; the switch in the top bar (as Stripe's test mode) keeps TEST in the member's session. Every
page and action reads its rows through `for_scope(project, environment)` with the session's mode, so an object
of the other environment is 404, as another project's is. Every form carries the mode it was shown in
(`environment`): one posted from a page left open in the other mode does nothing (a "Resend all matching" from
a TEST page must never resend the LIVE entries its filter also matches).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from messaging.models import Environment

SESSION_KEY = "dashboard_environment"
FIELD = "environment"


def current(request: HttpRequest) -> str:
    value = request.session.get(SESSION_KEY)
    return value if value in Environment.values else Environment.LIVE


def switch(request: HttpRequest, value: str) -> bool:
    """Show `value` from now on; False (and nothing changed) for a value that is not an environment."""
    if value not in Environment.values:
        return False
    request.session[SESSION_KEY] = value
    return True


def refused_page(request: HttpRequest, project: Any, reasons: list[str], back: str) -> HttpResponse:
    """A form the dashboard cannot act on: 400 with what was wrong, and nothing done."""
    projects = list(request.user.projects.order_by("name"))  # type: ignore[union-attr]
    return render(request, "dashboard/refused.html", {
        "project": project, "projects": projects, "section": "dead_letters", "environment": current(request),
        "reasons": reasons, "back": back,
    }, status=400)


def shown_mode_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A POST whose form was shown in the other mode answers 400 and does nothing (a form without the
    field acts in the current mode)."""
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        shown = request.POST.get(FIELD)
        mode = current(request)
        if shown is not None and shown != mode:
            label = Environment(shown).label.upper() if shown in Environment.values else repr(shown[:10])
            reasons = [f"This form was shown in {label} mode, and the dashboard is now in "
                       f"{Environment(mode).label.upper()} mode. Reload the page to act on what it shows."]
            return refused_page(request, None, reasons, request.path)
        return view(request, *args, **kwargs)
    return wrapper
