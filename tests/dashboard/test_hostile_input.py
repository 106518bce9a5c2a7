"""Malformed input on every dashboard form and view and every admin action: a 4xx (a form error page for
HTML, the JSON envelope for the dashboard's JSON endpoints), never a 5xx, and nothing changed (issue 21).

Values travel as a browser or a script would send them: percent-encoded bytes, so that a lone surrogate
or truncated UTF-8 reaches Django as the bytes it is (Django's test client would refuse to encode them).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from dashboard.forms import BULK_MAX_IDS
from dashboard.models import BulkResendJob
from ingestion.models import IngestionEvent
from messaging import opt_ins
from messaging.models import ApiKey, DeadLetter, Message
from tests.messaging.test_resend import RECIPIENT, failed_message

SURROGATE = "\ud800".encode("utf-8", "surrogatepass")  # a lone surrogate, as CESU/WTF-8 bytes
TRUNCATED = "€".encode()[:2]                          # UTF-8 cut in the middle of a character

# Each is one malformed value of a kind the issue names: a non-ASCII digit, NUL, lone surrogate,
# truncated UTF-8, huge numbers, wrong types, very long values, and dates at the edge of the calendar.
HOSTILE: list[str | bytes] = [
    "²", "١٢", "\x00", "1\x00", SURROGATE, TRUNCATED, "9" * 30, "-1", "0", "1e400", "nan", "1.5", " 1", "",
    "x" * 5000, "[1]", '{"a": 1}', "9999-12-31", "0001-01-01", "10000-01-01", "2024-02-30",
]


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")


def encode(data: dict[str, Any]) -> str:
    pairs = []
    for key, values in data.items():
        for value in values if isinstance(values, list) else [values]:
            pairs.append(f"{quote(key)}={quote(_bytes(value), safe='')}")
    return "&".join(pairs)


class Raw:
    """A logged-in client that sends form fields and query strings as percent-encoded bytes."""

    def __init__(self, client: Client):
        self.client = client

    def get(self, url: str, data: dict[str, Any] | None = None) -> Any:
        return self.client.get(f"{url}?{encode(data)}" if data else url)

    def post(self, url: str, data: dict[str, Any] | None = None) -> Any:
        return self.client.post(url, encode(data or {}), content_type="application/x-www-form-urlencoded")


def segment(value: str | bytes) -> str:
    return quote(_bytes(value), safe="")


@pytest.fixture
def entry(alice, alice_instance) -> DeadLetter:
    opt_ins.record(alice.project, RECIPIENT, "checkout")
    return failed_message(alice)


@pytest.fixture
def member(bob) -> Raw:
    client = Client(raise_request_exception=False)
    client.force_login(bob)
    return Raw(client)


@pytest.fixture
def ops(db) -> Raw:
    user = get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-123")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return Raw(client)


@pytest.fixture
def unprocessed(alice_instance) -> IngestionEvent:
    return IngestionEvent.objects.create(
        dedup_key="c" * 64, channel="WEBHOOK", event="connection.update", instance_name=alice_instance.name,
        payload={"event": "connection.update", "instance": alice_instance.name, "data": {"state": "close"}},
    )


def state() -> tuple:
    """Everything a dashboard form or an admin action could change."""
    return (
        tuple(DeadLetter.objects.order_by("pk").values_list("pk", "status", "resolved_by")),
        tuple(Message.objects.order_by("pk").values_list("pk", "status", "attempts")),
        BulkResendJob.objects.count(),
        tuple(ApiKey.objects.order_by("pk").values_list("pk", "revoked_at")),
        tuple(IngestionEvent.objects.order_by("pk").values_list("pk", "processed_at")),
    )


def label(value: str | bytes) -> str:
    return repr(value)[:24]


FILTER_FIELDS = ("status", "reason", "category", "to", "date_from", "date_to", "page")


# Valid dates at the calendar's ends are a filter like any other (test_the_calendars_last_day_…).
FORM_HOSTILE = [v for v in HOSTILE if v not in ("9999-12-31", "0001-01-01")]


def test_dashboard_forms_and_views_answer_4xx_and_change_nothing(member, entry):
    # One test over every value (not one per value): each would pay the actors' set-up again.
    before = state()
    server_errors, not_refused = {}, {}
    for value in FORM_HOSTILE:
        answers = _dashboard_answers(member, entry, value)
        server_errors.update({(label(value), name): code for name, code in answers.items() if code >= 500})
        # A value the form cannot use is refused, never read as "no filter": nothing was resent or dismissed.
        not_refused.update({(label(value), name): code for name, code in answers.items()
                            if name.startswith(("bulk ids", "bulk all")) and code != 400})
    assert server_errors == {}
    assert not_refused == {}
    assert state() == before


def _dashboard_answers(member: Raw, entry: DeadLetter, value: str | bytes) -> dict[str, int]:
    p = entry.project_id
    answers: dict[str, int] = {}

    answers["bulk ids"] = member.post(f"/dashboard/p/{p}/dead-letters/bulk-resend", {"ids": [value]}).status_code
    answers["bulk ids among good ones"] = member.post(
        f"/dashboard/p/{p}/dead-letters/bulk-resend", {"ids": [str(entry.pk), value]}).status_code
    for field in FILTER_FIELDS:
        answers[f"list {field}"] = member.get(f"/dashboard/p/{p}/dead-letters/", {field: value}).status_code
    for field in FILTER_FIELDS[:-1] if value else ():  # an empty filter field means "any": a valid filter
        answers[f"bulk all {field}"] = member.post(
            f"/dashboard/p/{p}/dead-letters/bulk-resend", {"scope": "all", "status": "OPEN", field: value}).status_code
    # The list's filter rides along with a selection (the way back): junk in it is never a 5xx either.
    answers["bulk filter fields"] = member.post(
        f"/dashboard/p/{p}/dead-letters/bulk-resend", {"query": value, "to": value, "page": value}).status_code
    answers["asset"] = member.get(f"/dashboard/assets/{segment(value)}").status_code
    for path in (f"/dashboard/p/{segment(value)}/", f"/dashboard/p/{segment(value)}/charts.json",
                 f"/dashboard/p/{p}/dead-letters/{segment(value)}/",
                 f"/dashboard/p/{p}/bulk/{segment(value)}/", f"/dashboard/p/{p}/bulk/{segment(value)}/progress.json",
                 f"/dashboard/p/{p}/messages/{segment(value)}/status.json"):
        answers[f"GET {path}"] = member.get(path).status_code
    for action in ("resend", "dismiss"):
        answers[action] = member.post(f"/dashboard/p/{p}/dead-letters/{segment(value)}/{action}").status_code
    return answers


def test_bulk_ids_with_a_non_ascii_digit_get_400_and_no_job(member, entry):
    before = state()
    response = member.post(f"/dashboard/p/{entry.project_id}/dead-letters/bulk-resend", {"ids": [str(entry.pk), "²"]})
    assert response.status_code == 400
    assert b"not a dead letter id" in response.content
    assert state() == before


def test_a_bulk_selection_is_bounded(member, entry):
    url = f"/dashboard/p/{entry.project_id}/dead-letters/bulk-resend"
    before = state()

    response = member.post(url, {"ids": [str(entry.pk)] + [str(n) for n in range(10**6, 10**6 + BULK_MAX_IDS)]})
    assert response.status_code == 400 and f"at most {BULK_MAX_IDS}".encode() in response.content
    # Thousands of fields: Django refuses the form before the view (DATA_UPLOAD_MAX_NUMBER_FIELDS).
    assert member.post(url, {"ids": [str(n) for n in range(5000)]}).status_code == 400
    assert state() == before

    response = member.post(url, {"ids": [str(entry.pk)] + [str(n) for n in range(10**6, 10**6 + BULK_MAX_IDS - 1)]})
    assert response.status_code == 302
    assert BulkResendJob.objects.get().total == 1


def test_resend_all_with_a_filter_the_form_refuses_gets_400_and_no_job(member, entry):
    before = state()
    response = member.post(f"/dashboard/p/{entry.project_id}/dead-letters/bulk-resend",
                           {"scope": "all", "status": "OPEN", "to": "not a phone"})
    assert response.status_code == 400 and b"Recipient" in response.content
    assert state() == before


@pytest.mark.parametrize("edge", ["date_to", "date_from"])
def test_the_calendars_last_day_is_a_filter_like_any_other(member, entry, edge):
    p = entry.project_id
    response = member.get(f"/dashboard/p/{p}/dead-letters/", {edge: "9999-12-31"})
    assert response.status_code == 200
    response = member.post(f"/dashboard/p/{p}/dead-letters/bulk-resend", {"scope": "all", edge: "9999-12-31",
                                                                          "status": "OPEN"})
    assert response.status_code == 302


def test_page_links_carry_the_filter_url_encoded(member, entry):
    response = member.get(f"/dashboard/p/{entry.project_id}/dead-letters/", {"to": "+55 11&page=9#x"})
    assert response.status_code == 200
    # The pager's links are "?{{ query }}&page=N": the value must not add a page, nor cut the link.
    assert response.context["query"] == "status=OPEN&to=%2B55+11%26page%3D9%23x"


def test_the_json_endpoints_answer_the_json_envelope(member, entry):
    p = entry.project_id
    for path in (f"/dashboard/p/{p}/bulk/{'9' * 30}/progress.json",
                 f"/dashboard/p/{p}/messages/00000000-0000-0000-0000-000000000000/status.json"):
        response = member.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found", path


# ---- admin ------------------------------------------------------------------------------------------

ADMIN_ACTIONS = [
    ("/admin/messaging/deadletter/", "force_resend"),
    ("/admin/messaging/deadletter/", "dismiss"),
    ("/admin/messaging/apikey/", "revoke"),
    ("/admin/ingestion/ingestionevent/", "reprocess"),
]
CHANGELISTS = ["/admin/messaging/deadletter/", "/admin/messaging/message/", "/admin/messaging/apikey/"]
PARAMETERS = ["q", "p", "o", "created_at__year", "created_at__month", "status__exact", "id__gt", "_to_field"]


def test_admin_actions_with_a_malformed_selection_answer_4xx_and_change_nothing(ops, entry, unprocessed):
    before = state()
    answers = {}
    for value in HOSTILE:
        for url, action in ADMIN_ACTIONS:
            for selected in ([value], [str(entry.pk), value]):
                response = ops.post(url, {"action": action, "_selected_action": selected, "index": value})
                answers[(label(value), url, action, len(selected))] = response.status_code
            response = ops.post(url, {"action": value, "_selected_action": [str(entry.pk)]})
            answers[(label(value), url, "action name")] = response.status_code
    assert {key: code for key, code in answers.items() if code >= 500} == {}
    assert {key: code for key, code in answers.items() if key[-1] in (1, 2) and code != 400} == {}
    assert state() == before


def test_admin_actions_refuse_thousands_of_ids(ops, entry):
    before = state()
    response = ops.post("/admin/messaging/deadletter/",
                        {"action": "dismiss", "_selected_action": [str(entry.pk)] + [str(n) for n in range(5000)]})
    assert response.status_code == 400
    assert state() == before


def test_admin_lists_and_pages_with_junk_parameters_never_answer_5xx(ops, entry, unprocessed):
    before = state()
    answers = {}
    for value in HOSTILE:
        for url in CHANGELISTS:
            for name in PARAMETERS:
                answers[(label(value), url, name)] = ops.get(url, {name: value}).status_code
        for url, name in (("/admin/ingestion/ingestionevent/", "received_at__year"),
                          ("/admin/ingestion/ingestionevent/", "processed"),
                          ("/admin/auth/user/", "date_joined__year"), ("/admin/messaging/messageevent/", "created_at__day")):
            answers[(label(value), url, name)] = ops.get(url, {name: value}).status_code
        answers[(label(value), "year and month")] = ops.get(
            "/admin/messaging/deadletter/", {"created_at__year": value, "created_at__month": "12"}).status_code
        for path in ("/admin/messaging/deadletter/{}/change/", "/admin/messaging/message/{}/change/",
                     "/admin/ingestion/ingestionevent/{}/change/", "/admin/messaging/apikey/{}/delete/"):
            answers[(label(value), path)] = ops.get(path.format(segment(value))).status_code
    assert {key: code for key, code in answers.items() if code >= 500} == {}
    assert state() == before


@pytest.mark.parametrize("year", ["0", "9999", "-1", "99999"])
def test_admin_date_drilldown_at_the_edge_of_the_calendar(ops, entry, year):
    response = ops.get("/admin/messaging/deadletter/", {"created_at__year": year})
    assert response.status_code in (200, 302, 400)
