"""Small helpers shared by the scenarios."""

from __future__ import annotations

import secrets
import time
from collections import Counter
from typing import Any

import requests

from ..context import Sent


def answers(sent: list[Sent]) -> dict[str, int]:
    """Final answers by status; `retried` counts sends that needed a retry (same Idempotency-Key)
    because an earlier try got no answer at all."""
    counts = dict(Counter(str(s.status) for s in sent))
    retried = sum(1 for s in sent if s.tries > 1)
    if retried:
        counts["retried"] = retried
    return counts


def accepted_ids(sent: list[Sent]) -> list[str]:
    return [s.id for s in sent if s.id]


def duplicate_sends(groups: dict[str, list[dict[str, Any]]], texts: set[str] | None = None) -> dict[str, int]:
    """sendText calls beyond the first per message text (all calls, and only the 201s)."""
    extra_calls = extra_201 = 0
    for text, calls in groups.items():
        if texts is not None and text not in texts:
            continue
        extra_calls += max(0, len(calls) - 1)
        extra_201 += max(0, sum(1 for c in calls if c.get("status") == 201) - 1)
    return {"extra_calls": extra_calls, "extra_accepted_sends": extra_201}


def pids(stack: Any, names: tuple[str, ...] = ("relay", "consumer", "web")) -> dict[str, int | None]:
    return {n: (p.proc.pid if p.alive() else None) for n, p in stack.processes.items() if n in names or n.startswith("worker-")}


def pause(seconds: float) -> None:
    time.sleep(seconds)


def dashboard_session(ctx: Any, project: Any) -> requests.Session:
    """A new member of `project`, logged in to the dashboard over HTTP (the CSRF cookie in the session)."""
    from messaging import operators

    username, password = f"chaos-{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    operators.create_member(project.pk, username, password)
    http = requests.Session()
    login = f"{ctx.stack.web_url}/dashboard/login/"
    http.get(login, timeout=15)
    r = http.post(login, data={"username": username, "password": password,
                               "csrfmiddlewaretoken": http.cookies.get("csrftoken", "")},
                  headers={"Referer": login}, timeout=15, allow_redirects=False)
    if r.status_code != 302:
        raise RuntimeError(f"dashboard login failed: {r.status_code}")
    return http
