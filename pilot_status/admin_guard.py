"""Malformed input to Django admin gets a 400 before admin reads it (issue 21: no 5xx for bad input).

Admin answers most junk itself (an unknown filter, a bad page number, a non-numeric object id), but a few
values reach the database or the calendar unchecked and end in a 500:
- an action's `_selected_action` that is not a primary key ("²", "", "1.5", a NUL): `pk__in` raises;
- NUL in a filter value (`?status__exact=%00`): Postgres text cannot hold it;
- a date drill-down outside the calendar (`?created_at__year=0`, `=9999`, `=99…9`);
and a search term of many thousand words becomes a query with as many clauses. This middleware looks at
the requests of ModelAdmin views only (Django marks them with `model_admin`), for every model in admin.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.contrib.admin import helpers
from django.core.exceptions import ValidationError
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict

# Bounds (docs/security.md): a search box of at most this many characters...
ADMIN_SEARCH_MAX_CHARS = 200
# ...and an action over at most this many ticked rows (a page shows 100; "select all" is its own flag).
ADMIN_ACTION_MAX_SELECTED = 500
# A drill-down year whose next year is still a date (admin computes it): 1..9998.
_DATE_PART = re.compile(r"__(year|iso_year|month|day|week|week_day|iso_week_day|quarter)$")
_NUMBER = re.compile(r"[0-9]{1,4}")
_BIGINT_MAX = 2**63 - 1


def _problem_in_values(data: QueryDict, where: str) -> str | None:
    for key, values in data.lists():
        if "\x00" in key or any("\x00" in value for value in values):
            return f"{where} parameter {key[:40]!r} contains a NUL character"
    return None


def _problem_in_query(query: QueryDict) -> str | None:
    problem = _problem_in_values(query, "query")
    if problem:
        return problem
    if len(query.get("q", "")) > ADMIN_SEARCH_MAX_CHARS:
        return f"search text is longer than {ADMIN_SEARCH_MAX_CHARS} characters"
    for key, values in query.lists():
        part = _DATE_PART.search(key)
        if part is None:
            continue
        for value in values:
            if not _NUMBER.fullmatch(value):
                return f"{key[:40]!r} must be a number"
            if part.group(1) in ("year", "iso_year") and not 1 <= int(value) <= 9998:
                return f"{key[:40]!r} must be a year between 1 and 9998"
    return None


def _problem_in_selection(model_admin: Any, form: QueryDict) -> str | None:
    selected = form.getlist(helpers.ACTION_CHECKBOX_NAME)
    if len(selected) > ADMIN_ACTION_MAX_SELECTED:
        return f"an action takes at most {ADMIN_ACTION_MAX_SELECTED} selected rows (use “select all” for more)"
    pk: models.Field[Any, Any] = model_admin.model._meta.pk
    for value in selected:
        try:
            parsed = pk.to_python(value)
        except (ValidationError, ValueError, TypeError, OverflowError):
            parsed = None
        if parsed is None or parsed == "" or (isinstance(parsed, int) and not 0 < parsed <= _BIGINT_MAX) \
                or (isinstance(pk, models.IntegerField) and not re.fullmatch(r"[0-9]+", value)):
            return f"{value[:40]!r} is not an id of a {model_admin.model._meta.verbose_name}"
    return None


class AdminInputGuard:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any) -> HttpResponse | None:
        model_admin = getattr(view_func, "model_admin", None)
        if model_admin is None:
            return None  # not an admin model page: one attribute look-up is all this costs
        problem = _problem_in_query(request.GET)
        if problem is None and request.method == "POST":
            problem = _problem_in_values(request.POST, "form") or _problem_in_selection(model_admin, request.POST)
        if problem is None:
            return None
        return HttpResponseBadRequest(f"Bad request: {problem}. Nothing was changed.\n", content_type="text/plain")
