"""Customer dashboard: a member reviews their project's dead letters and acts on them.

Function views, @login_required; every lookup goes through the member's project and the mode's
environment (dashboard.environments), so another project's pages and entries, and the other
environment's, are 404. Actions are POST-only and call messaging.resend.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db import OperationalError, transaction
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from messaging import resend, timeline
from messaging.errors import Rejected
from messaging.models import DeadLetter, DeadLetterStatus, Message, Project, Status
from messaging.representations import iso
from pilot_status.errors import error_response

from . import bulk, charts, environments, overview, tasks
from .csp import same_origin_only
from .environments import shown_mode_only
from .forms import DeadLetterFilterForm, selected_ids
from .models import BulkResendJob

PAGE_SIZE = 25
IN_FLIGHT = {Status.QUEUED, Status.SENDING, Status.SENT, Status.SERVER_ACK}
ASSETS = Path(__file__).resolve().parent / "static" / "dashboard"
ASSET_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}
# The chart library, vendored at a pinned version (static/dashboard/VENDORED.md); never a CDN.
CHART_JS = "chart-4.6.1.umd.min.js"


def _project(request: HttpRequest, project_id: int) -> Project:
    # Membership is the whole permission model: not a member → the project does not exist.
    return get_object_or_404(Project, pk=project_id, members=request.user)


def _dead_letter(request: HttpRequest, project: Project, dead_letter_id: int) -> DeadLetter:
    rows = DeadLetter.objects.for_scope(project, environments.current(request)).select_related("message__instance")
    entry: DeadLetter = get_object_or_404(rows, pk=dead_letter_id)
    return entry


def _actor(request: HttpRequest) -> str:
    return f"dashboard:{request.user.get_username()}"


def _page(request: HttpRequest, template: str, project: Project | None, section: str, status: int = 200,
          **context: Any) -> HttpResponse:
    projects = list(request.user.projects.order_by("name"))  # type: ignore[union-attr]
    return render(request, template, {"project": project, "projects": projects, "section": section,
                                      "environment": environments.current(request), **context}, status=status)


def _refused(request: HttpRequest, project: Project, reasons: list[str], query: list[tuple[str, str]]) -> HttpResponse:
    """A form the dashboard cannot act on: 400 with what was wrong, and nothing done."""
    back = reverse("dashboard:dead_letters", args=[project.pk])
    return environments.refused_page(request, project, reasons, f"{back}?{urlencode(query)}" if query else back)


def _json_errors(view: Callable[..., JsonResponse]) -> Callable[..., JsonResponse]:
    """The dashboard's JSON endpoints answer a missing object with the JSON error envelope, not the HTML page."""
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
        try:
            return view(request, *args, **kwargs)
        except Http404:
            return error_response(404, "not_found", "No such resource.")
    return wrapper


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    projects = list(request.user.projects.order_by("name"))  # type: ignore[union-attr]
    if len(projects) == 1:
        return redirect("dashboard:overview", project_id=projects[0].pk)
    return _page(request, "dashboard/projects.html", None, "projects")


@login_required
@require_GET
@same_origin_only
def overview_page(request: HttpRequest, project_id: int) -> HttpResponse:
    project = _project(request, project_id)
    environment = environments.current(request)
    return _page(
        request, "dashboard/overview.html", project, "overview",
        today=overview.today_by_lane(project, environment), since=overview.start_of_today(),
        instances=overview.instances(project),
        dlq=overview.open_dead_letters(project, environment),
        chart_js=CHART_JS,
    )


@login_required
@require_GET
@_json_errors
def charts_data(request: HttpRequest, project_id: int) -> JsonResponse:
    """The overview's charts: the last 24 hours of the member's own project (dashboard.charts)."""
    project = _project(request, project_id)
    try:
        data = charts.for_scope(project, environments.current(request))
    except OperationalError:
        # The statement timeout (DASHBOARD_CHART_TIMEOUT_MS) or a database away: the page says so.
        return error_response(503, "charts_unavailable", "The charts could not be computed just now; try again.")
    response = JsonResponse(data.as_json())
    response["Cache-Control"] = "private, no-store"
    return response


@login_required
@require_GET
def dead_letter_list(request: HttpRequest, project_id: int) -> HttpResponse:
    project = _project(request, project_id)
    form = DeadLetterFilterForm.from_query(request.GET)
    matching = resend.matching(project, environments.current(request), form.filters())
    rows = matching.select_related("message").order_by("-created_at", "-pk")
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    query_items = form.query_items()
    matching_open = matching.filter(status=DeadLetterStatus.OPEN).count()
    return _page(
        request, "dashboard/dead_letters.html", project, "dead_letters",
        form=form, page=page, query_items=query_items, query=urlencode(query_items), matching_open=matching_open,
    )


@login_required
@require_GET
def dead_letter_detail(request: HttpRequest, project_id: int, dead_letter_id: int) -> HttpResponse:
    project = _project(request, project_id)
    entry = _dead_letter(request, project, dead_letter_id)
    message = entry.message
    # The latest lines, or with ?before=<cursor> the ones before them (messaging.timeline): a long
    # hold or many resends never make the page load the whole timeline.
    before = request.GET.get("before") or None
    try:
        lines = timeline.page(message, before) if before else timeline.latest(message)
    except timeline.BadCursor:
        before, lines = None, timeline.latest(message)
    return _page(
        request, "dashboard/dead_letter.html", project, "dead_letters",
        entry=entry, message=message, events=list(reversed(lines.lines)) if before else lines.lines,
        events_total=message.events.count(), older_cursor=lines.next_cursor, paged_back=before is not None,
        in_flight=message.status in IN_FLIGHT,
    )


def _back_to(entry: DeadLetter) -> HttpResponse:
    return redirect("dashboard:dead_letter", project_id=entry.project_id, dead_letter_id=entry.pk)


@login_required
@require_POST
@shown_mode_only
def resend_one(request: HttpRequest, project_id: int, dead_letter_id: int) -> HttpResponse:
    entry = _dead_letter(request, _project(request, project_id), dead_letter_id)
    try:
        correction = resend.check_correction(request.POST.get("to"), request.POST.get("instance"))
        done = resend.force_resend(
            entry, _actor(request), confirm_maybe_delivered=request.POST.get("confirm_maybe_delivered") == "1",
            correction=correction,
        )
    except Rejected as refused:
        messages.error(request, f"Not resent: {refused.message} ({refused.code})")
        return _back_to(entry)
    if done.changed:
        messages.success(request, "Resent. The message is queued again with a fresh set of attempts.")
    else:
        messages.info(request, "Nothing to do: this entry was already handled.")
    return _back_to(entry)


@login_required
@require_POST
@shown_mode_only
def dismiss_one(request: HttpRequest, project_id: int, dead_letter_id: int) -> HttpResponse:
    entry = _dead_letter(request, _project(request, project_id), dead_letter_id)
    try:
        done = resend.dismiss(entry, _actor(request))
    except Rejected as refused:
        messages.error(request, f"Not dismissed: {refused.message}")
        return _back_to(entry)
    messages.success(request, "Dismissed." if done.changed else "Nothing to do: this entry was already handled.")
    return _back_to(entry)


@login_required
@require_POST
@shown_mode_only
def bulk_resend(request: HttpRequest, project_id: int) -> HttpResponse:
    project = _project(request, project_id)
    # The filter the person was looking at rides along as hidden fields (the way back to the list).
    form = DeadLetterFilterForm.from_query(request.POST)
    if request.POST.get("scope") == "all":
        if not form.is_valid():
            # Never read a filter the form refuses as "no filter": that would resend more than was shown.
            reasons = [f"{form[name].label if name in form.fields else name}: {' '.join(map(str, errors))}"
                       for name, errors in form.errors.items()]
            return _refused(request, project, reasons, [])
        start: dict[str, Any] = {"filters": form.filters()}
    else:
        try:
            ids = selected_ids(request.POST.getlist("ids"))
        except forms.ValidationError as refused:
            return _refused(request, project, [str(m) for m in refused.messages], form.query_items())
        if not ids:
            messages.error(request, "Tick at least one dead letter, or use “Resend all matching”.")
            return redirect(f"{reverse('dashboard:dead_letters', args=[project.pk])}?{urlencode(form.query_items())}")
        start = {"ids": ids}
    with transaction.atomic():
        job = bulk.start(project, request.user, _actor(request), environment=environments.current(request), **start)
        if job.total:
            tasks.enqueue_on_commit(job.pk)
    return redirect("dashboard:bulk_job", project_id=project.pk, job_id=job.pk)


def _job(request: HttpRequest, project: Project, job_id: int) -> BulkResendJob:
    return get_object_or_404(BulkResendJob, pk=job_id, project=project, environment=environments.current(request))


@login_required
@require_GET
def bulk_job(request: HttpRequest, project_id: int, job_id: int) -> HttpResponse:
    project = _project(request, project_id)
    job = _job(request, project, job_id)
    if bulk.stalled(job):
        tasks.enqueue(job.pk)
    return _page(request, "dashboard/bulk_job.html", project, "dead_letters", job=job, progress=bulk.progress(job))


@login_required
@require_GET
@_json_errors
def bulk_job_progress(request: HttpRequest, project_id: int, job_id: int) -> JsonResponse:
    job = _job(request, _project(request, project_id), job_id)
    if bulk.stalled(job):
        tasks.enqueue(job.pk)
    return JsonResponse(bulk.progress(job))


@login_required
@require_GET
@_json_errors
def message_status(request: HttpRequest, project_id: int, message_id: str) -> JsonResponse:
    project = _project(request, project_id)
    message = get_object_or_404(Message.objects.for_scope(project, environments.current(request)), pk=message_id)
    return JsonResponse({"id": str(message.pk), "status": message.status, "events": message.events.count(),
                         "outcomeUnknown": message.outcome_unknown, "unacknowledged": message.unacknowledged,
                         "unacknowledgedAt": iso(message.unacknowledged_at)})


@login_required
@require_POST
def switch_environment(request: HttpRequest, project_id: int) -> HttpResponse:
    """The mode switch: show TEST or LIVE from now on, then go back to the page it was used on."""
    project = _project(request, project_id)
    if not environments.switch(request, request.POST.get(environments.FIELD, "")):
        return environments.refused_page(request, project, ["The environment must be TEST or LIVE."],
                                         reverse("dashboard:overview", args=[project.pk]))
    back = request.POST.get("next", "")
    if not (back.startswith("/dashboard/") and url_has_allowed_host_and_scheme(back, allowed_hosts=None)):
        back = reverse("dashboard:overview", args=[project.pk])
    return redirect(back)


@require_GET
def asset(request: HttpRequest, name: str) -> FileResponse:
    """The dashboard's own CSS/JS, served without a CDN or a collectstatic step."""
    path = ASSETS / name
    if path.suffix not in ASSET_TYPES or path.parent != ASSETS or not path.is_file():
        raise Http404()
    response = FileResponse(path.open("rb"), content_type=ASSET_TYPES[path.suffix])
    response["Cache-Control"] = "public, max-age=300"
    return response
