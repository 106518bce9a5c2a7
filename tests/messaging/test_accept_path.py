"""The accept hot path (issue 7, B1): one read and one write per message, the same answers as before.

- the funnel's facts (stored answer, opt-in, candidate instances) come from one query, and its
  instance choice equals the former query-per-step choice on every combination tried here;
- the message, its ACCEPTED event, its outbox row and the idempotent answer are one statement;
- an expired Idempotency-Key answer is replaced in place (no per-request DELETE any more);
- a used Idempotency-Key still answers before the payload, also for a body that is not JSON.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Case, IntegerField, Value, When
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from messaging import opt_ins, rules
from messaging.accept import SendRequest, accept_message, check_funnel
from messaging.errors import Rejected
from messaging.models import ApiKey, ConnectionState, IdempotencyRecord, Instance, Message, MessageEvent, OutboxEntry
from pilot_status import metrics
from tests.conftest import add_instance

URL = "/v1/messages/send"
RECIPIENT = "+5511988887777"
BODY = {"to": RECIPIENT, "category": "UTILITY", "text": "Hello {{name}}", "variables": {"name": "Ana"}}


# ---- the instance choice: one query, the same answer as the former one-query-per-step code ----

def _open_first(queryset):
    return queryset.annotate(
        _closed=Case(When(connection_state=ConnectionState.OPEN, then=Value(0)), default=Value(1),
                     output_field=IntegerField())
    ).order_by("_closed", "priority", "pk")


def former_resolve_instance(project, category, requested, opted_in):
    """rules.resolve_instance before issue 7, verbatim but for the name: the oracle."""
    own = Instance.objects.filter(project=project)
    if requested:
        instance = own.filter(name=requested).first()
        return (None, "unknown_instance") if instance is None else (instance, None)
    if category == "MARKETING":
        instance = _open_first(own).first()
        return (instance, None) if instance else (None, "own_instance_required")
    shared = Instance.objects.filter(project__isnull=True)
    if category == "OTP" and not opted_in:
        official = _open_first(shared.filter(is_official=True)).first()
        if official is not None:
            return official, None
    own_open = own.filter(connection_state=ConnectionState.OPEN).order_by("priority", "pk").first()
    if own_open is not None:
        return own_open, None
    default = _open_first(shared).first()
    if default is not None:
        return default, None
    fallback = _open_first(own).first()
    return (fallback, None) if fallback else (None, "no_instance_available")


def former_check_funnel(project, environment, req):
    code = rules.check_environment(project, environment, req.to)
    if code:
        return code
    opted_in = rules.has_live_opt_in(project, environment, req.to)
    instance, code = former_resolve_instance(project, req.category, req.instance, opted_in)
    if code or instance is None:
        return code or "no_instance_available"
    return rules.check_opt_in(req.category, instance, opted_in) or instance.name


def new_check_funnel(project, environment, req):
    try:
        return check_funnel(project, environment, req).name
    except Rejected as rejected:
        return rejected.code


# (name, project?, official, priority, state): None project = Pilot Status' own.
LAYOUTS = {
    "nothing": [],
    "own open": [("own-a", True, False, 10, "open")],
    "own closed": [("own-a", True, False, 10, "close")],
    "own closed + open, priorities": [("own-a", True, False, 5, "close"), ("own-b", True, False, 20, "open"),
                                      ("own-c", True, False, 10, "connecting")],
    "own closed, shared closed": [("own-a", True, False, 10, "close"), ("ps-a", False, False, 1, "close")],
    "own closed, shared open + closed": [("own-a", True, False, 10, "close"), ("ps-a", False, False, 1, "close"),
                                         ("ps-b", False, False, 50, "open")],
    "shared only, official closed": [("ps-off", False, True, 1, "close"), ("ps-a", False, False, 5, "open")],
    "everything": [("own-a", True, False, 10, "open"), ("own-b", True, False, 1, "close"),
                   ("ps-off", False, True, 1, "open"), ("ps-off2", False, True, 0, "close"),
                   ("ps-a", False, False, 2, "open")],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_one_query_choice_equals_the_former_choice(alice, carol, layout):
    for name, own, official, priority, state in LAYOUTS[layout]:
        instance = add_instance(alice.project if own else None, name, official=official, priority=priority)
        Instance.objects.filter(pk=instance.pk).update(connection_state=state)
    add_instance(carol.project, "carol-main")
    opted = "+5511988880001"
    opt_ins.record(alice.project, opted, "form")
    names = [None, "carol-main", "own-a", "own-b", "ps-a"]
    for category, to, requested in itertools.product(("OTP", "UTILITY", "MARKETING"), (opted, RECIPIENT), names):
        req = SendRequest(to=to, category=category, template="hi", instance=requested)
        assert new_check_funnel(alice.project, "LIVE", req) == former_check_funnel(alice.project, "LIVE", req), (
            layout, category, to, requested)


# ---- the write ----------------------------------------------------------------------------

def test_accepting_is_one_read_and_one_write_then_one_statement(alice, alice_instance):
    """The first accept of a project in this process reads the funnel's facts, then writes; the next
    ones fold that read into the write's guard (messaging.accept, the one-statement accept)."""
    opt_ins.record(alice.project, RECIPIENT, "form")
    key = ApiKey.objects.get(project=alice.project, environment="LIVE")
    req = SendRequest(to=RECIPIENT, category="UTILITY", template="Hello {{n}}", variables={"n": 1})
    for idempotency_key, statements in ((None, 2), ("one-statement", 1)):
        with CaptureQueriesContext(connection) as queries:
            body = accept_message(alice.project, key, "LIVE", req, idempotency_key, "hash")
        assert len(queries) == statements
        message = Message.objects.get(pk=body["id"])
        assert message.text == "Hello 1" and message.instance == alice_instance and message.api_key == key
        assert [(e.kind, e.actor, e.detail) for e in MessageEvent.objects.filter(message=message)] == [
            ("ACCEPTED", key.display_prefix, {"instance": "alice-main"})
        ]
        entry = OutboxEntry.objects.get(message=message)
        assert (entry.lane, entry.project_id_copy, entry.priority) == ("utility", alice.project.pk, 0)
    record = IdempotencyRecord.objects.get()
    assert (record.key, record.request_hash, record.status_code) == ("one-statement", "hash", 202)
    assert record.response == body


def test_the_read_and_the_write_are_prepared_statements(alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "form")
    req = SendRequest(to=RECIPIENT, category="UTILITY", template="Hello")
    for i in range(3):
        accept_message(alice.project, None, "LIVE", req, f"prepared-{i}", "hash")
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        prepared = [row[0] for row in cursor.fetchall()]
    assert [s for s in prepared if 'INSERT INTO "messaging_message"' in s] and [s for s in prepared if "opted_in" in s]


def test_an_urgent_message_gets_an_urgent_outbox_row(alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "form")
    body = accept_message(alice.project, None, "LIVE", SendRequest(RECIPIENT, "OTP", "123", priority="urgent"))
    assert OutboxEntry.objects.get(message_id=body["id"]).priority == 1


def test_the_accepted_event_is_still_counted(alice, alice_instance, django_capture_on_commit_callbacks):
    opt_ins.record(alice.project, RECIPIENT, "form")
    name = metrics.MESSAGES + "status:QUEUED:otp"
    before = int(metrics.redis().get(name) or 0)
    with django_capture_on_commit_callbacks(execute=True):
        assert alice.client().post(URL, dict(BODY, category="OTP"), format="json").status_code == 202
    assert int(metrics.redis().get(name) or 0) == before + 1


def test_an_expired_answer_is_replaced_by_a_new_send(alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "form")
    old = IdempotencyRecord.objects.create(project=alice.project, key="reused", request_hash="old", status_code=202,
                                           response={"id": "old"})
    IdempotencyRecord.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=25))

    response = alice.client().post(URL, BODY, format="json", HTTP_IDEMPOTENCY_KEY="reused")

    assert response.status_code == 202 and "Idempotent-Replayed" not in response
    record = IdempotencyRecord.objects.get()
    assert record.response == response.json() and record.request_hash != "old"
    assert record.created_at > timezone.now() - timedelta(minutes=1)
    again = alice.client().post(URL, BODY, format="json", HTTP_IDEMPOTENCY_KEY="reused")
    assert again["Idempotent-Replayed"] == "true" and again.json() == response.json()
    assert Message.objects.count() == 1


@pytest.mark.parametrize(
    "payload, content_type",
    [(b"{not json", "application/json"), (b"to=+5511988887777", "application/x-www-form-urlencoded"),
     (b'{"to": "nope"}', "application/json")],
)
def test_a_used_key_answers_409_before_the_payload_is_judged(alice, alice_instance, payload, content_type):
    opt_ins.record(alice.project, RECIPIENT, "form")
    client = alice.client()
    assert client.post(URL, BODY, format="json", HTTP_IDEMPOTENCY_KEY="used").status_code == 202

    response = client.generic("POST", URL, payload, content_type=content_type, HTTP_IDEMPOTENCY_KEY="used")

    assert response.status_code == 409 and response.json()["error"]["code"] == "idempotency_conflict"
    # and without the key the same body is judged as a payload
    assert client.generic("POST", URL, payload, content_type=content_type).status_code in (400, 415)


def test_a_key_used_by_another_project_is_not_replayed(alice, alice_instance, carol):
    add_instance(carol.project, "carol-main")
    opt_ins.record(carol.project, RECIPIENT, "form")
    IdempotencyRecord.objects.create(project=alice.project, key="shared-name", request_hash="x", status_code=202,
                                     response={"id": "alice's"})
    response = carol.client().post(URL, BODY, format="json", HTTP_IDEMPOTENCY_KEY="shared-name")
    assert response.status_code == 202 and response.json()["instance"] == "carol-main"


# ---- the first read is the connection's health check --------------------------------------

def test_a_pooled_connection_postgres_dropped_is_replaced_not_answered_503(transactional_db, alice, alice_instance):
    from django.db import connections

    opt_ins.record(alice.project, RECIPIENT, "form")
    client = alice.client()
    assert client.post(URL, BODY, format="json").status_code == 202  # key cached, connection open
    pid = connection.connection.info.backend_pid
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    connection.health_check_done = False  # a new request on the pooled connection (request_started)

    response = client.post(URL, dict(BODY, text="after"), format="json")

    assert response.status_code == 202, response.content
    assert connection.connection.info.backend_pid != pid
    assert Message.objects.filter(text="after").count() == 1


def test_no_separate_health_check_before_the_first_statement(
    transactional_db, alice, alice_instance, monkeypatch
):
    opt_ins.record(alice.project, RECIPIENT, "form")
    client = alice.client()
    assert client.post(URL, BODY, format="json").status_code == 202
    checks = []
    monkeypatch.setattr(connection, "is_usable", lambda: checks.append("SELECT 1") or True)
    connection.health_check_done = False  # a new request on the pooled connection
    with CaptureQueriesContext(connection) as queries:
        assert client.post(URL, BODY, format="json").status_code == 202
    # the guarded write (one statement, see test_accept_fast_path.py) is the health check
    assert checks == [], checks
    assert len(queries) == 1, [str(q["sql"])[:60] for q in queries]
