"""S2: another tenant's keys and session against every /v1 route and every dashboard page that takes
an id, with project A's ids, over HTTP on the running stack. Each answers 404 (a send naming A's
instance: 422 `unknown_instance`, as docs/api.md says) and nothing of A's changes."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import requests
from django.urls import URLPattern
from django.utils import timezone

from ..context import Context
from .common import dashboard_session

FAULT = "project C's API key and dashboard session with project A's ids, on every route"
MUST = "404 each, nothing changed"
METHODS = ("get", "post", "put", "patch", "delete")


def _objects_of_a(ctx: Context) -> dict[str, str]:
    from dashboard.models import BulkResendJob
    from messaging import opt_ins
    from messaging.models import DeadLetter, Message

    a = ctx.world.a
    message = Message.objects.create(
        project=a.project, environment="LIVE", category="UTILITY", to=a.recipients[0], template="s2", text="s2",
        instance=a.instance, deliver_until=timezone.now() + timedelta(hours=1), status="FAILED",
        failure_reason="INVALID_RECIPIENT")
    dead = DeadLetter.objects.create(message=message, project=a.project, reason="INVALID_RECIPIENT")
    opt_ins.record(a.project, a.recipients[0], "s2")
    job = BulkResendJob.objects.create(project=a.project, actor="s2", dead_letter_ids=[dead.pk], total=1)
    return {"message_id": str(message.pk), "phone": a.recipients[0], "dead_letter_id": str(dead.pk),
            "job_id": str(job.pk), "project_id": str(a.project.pk), "name": a.instance.name}


def _snapshot() -> tuple[Any, ...]:
    from dashboard.models import BulkResendJob
    from messaging.models import DeadLetter, Instance, Message, OptIn

    return (sorted(Message.objects.values_list("pk", "status", "attempts", "updated_at")),
            sorted(Instance.objects.values_list("pk", "send_profile", "send_policy")),
            sorted(DeadLetter.objects.values_list("pk", "status", "resolved_by")),
            sorted(OptIn.objects.values_list("pk", "revoked_at")),
            sorted(BulkResendJob.objects.values_list("pk", "status", "cursor")))


def _fill(route: str, ids: dict[str, str]) -> str:
    return re.sub(r"<(?:\w+:)?(\w+)>", lambda m: ids[m.group(1)], route)


def _json_code(r: requests.Response) -> str:
    try:
        return str(r.json()["error"]["code"])
    except Exception:
        return "not-json"


def _api(ctx: Context, ids: dict[str, str]) -> list[dict[str, Any]]:
    from messaging.api import urls as api_urls

    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {ctx.world.c.live_key}"
    rows = []
    for pattern in api_urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        if not pattern.pattern.converters:
            continue
        path = "/v1/" + _fill(str(pattern.pattern), ids)
        view = pattern.callback.view_class
        for method in METHODS:
            if hasattr(view, method):
                r = http.request(method.upper(), ctx.stack.web_url + path, json={}, timeout=15)
                rows.append({"call": f"{method.upper()} /v1/{pattern.pattern}", "status": r.status_code,
                             "code": _json_code(r), "ok": r.status_code == 404})
    # Listing and sending with A's objects: C's list holds none of them; naming A's instance is refused.
    r = http.get(f"{ctx.stack.web_url}/v1/messages", timeout=15)
    leaked = [m for m in r.json().get("results", r.json().get("data", [])) if str(m.get("id")) == ids["message_id"]] \
        if r.status_code == 200 else []
    rows.append({"call": "GET /v1/messages (list)", "status": r.status_code, "code": f"{len(leaked)} of A's",
                 "ok": r.status_code == 200 and not leaked})
    r = http.post(f"{ctx.stack.web_url}/v1/messages/send", timeout=15,
                  json={"to": ctx.world.a.recipients[0], "category": "UTILITY", "text": "s2",
                        "instance": ctx.world.a.instance.name})
    rows.append({"call": "POST /v1/messages/send naming A's instance", "status": r.status_code, "code": _json_code(r),
                 "ok": r.status_code == 422 and _json_code(r) == "unknown_instance"})
    return rows


def _dashboard(ctx: Context, ids: dict[str, str]) -> list[dict[str, Any]]:
    from dashboard import urls as dashboard_urls

    http = dashboard_session(ctx, ctx.world.c.project)
    csrf = http.cookies.get("csrftoken", "")
    rows = []
    for pattern in dashboard_urls.urlpatterns:
        params = set(pattern.pattern.converters)
        if "project_id" not in params:
            continue
        # With A's project id, and with C's own project id but A's object ids.
        variants = [("A's project", ids)]
        if params - {"project_id"}:
            variants.append(("C's project, A's object", {**ids, "project_id": str(ctx.world.c.project.pk)}))
        for label, values in variants:
            url = f"{ctx.stack.web_url}/dashboard/{_fill(str(pattern.pattern), values)}"
            posts = ("resend" in pattern.name or "dismiss" in pattern.name or "bulk_resend" == pattern.name
                     or pattern.name == "environment")  # the TEST/LIVE mode switch
            if posts:
                r = http.post(url, data={"csrfmiddlewaretoken": csrf}, headers={"Referer": url}, timeout=15,
                              allow_redirects=False)
            else:
                r = http.get(url, timeout=15, allow_redirects=False)
            rows.append({"call": f"{'POST' if posts else 'GET'} /dashboard/{pattern.pattern} ({label})",
                         "status": r.status_code, "code": "", "ok": r.status_code == 404})
    return rows


def run(ctx: Context) -> dict[str, Any]:
    ctx.fresh()
    ids = _objects_of_a(ctx)
    before = _snapshot()
    rows = _api(ctx, ids) + _dashboard(ctx, ids)
    unchanged = _snapshot() == before
    bad = [r for r in rows if not r["ok"]]
    figures = {"calls": len(rows), "answered_as_expected": len(rows) - len(bad),
               "unexpected": [f"{r['call']} → {r['status']} {r['code']}" for r in bad], "a_unchanged": unchanged}
    return {"passed": not bad and unchanged, "fault": FAULT, "must": MUST, "figures": figures,
            "notes": [], "calls": rows}
