"""The one statement writes the rows save() writes (issue 25: built on Django's insert compiler).

messaging.inserts composes its one statement from the INSERTs Django's insert compiler writes for
save(). The oracle is save() itself, of the same objects in transaction.atomic(): for every kind of value an accept writes, both leave the same
columns in every table and send the same post_save signals.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import transaction
from django.db.models.signals import post_save
from django.utils import timezone

from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS

from messaging import inserts, opt_ins, prepared
from messaging.accept import SendRequest, accept_message
from messaging.models import ApiKey, EventKind, IdempotencyRecord, Message, MessageEvent, OutboxEntry, Priority, Status

NOW = timezone.now()
TABLES = (Message, MessageEvent, OutboxEntry, IdempotencyRecord)


def rows(alice: Any, instance: Any, message_id: uuid.UUID, **message_fields: Any) -> list[Any]:
    fields: dict[str, Any] = dict(
        id=message_id, project=alice.project, api_key=None, environment="LIVE", category="UTILITY",
        priority=Priority.NORMAL, to="+5511988887777", template="Hi {{n}}", variables={"n": 1}, text="Hi 1",
        metadata={"k": [1, None], "é": "ü"}, instance=instance, requested_instance="",
        deliver_until=NOW + timedelta(hours=1), next_attempt_at=NOW, max_attempts=10, created_at=NOW,
    )
    fields.update(message_fields)
    message = Message(**fields)
    return [
        message,
        MessageEvent(message=message, kind=EventKind.ACCEPTED, actor="ps_live_ab", detail={"instance": instance.name},
                     created_at=NOW),
        OutboxEntry(message=message, project_id_copy=alice.project.pk, lane="utility", priority=1, available_at=NOW,
                    created_at=NOW),
        IdempotencyRecord(project=alice.project, key="k-1", request_hash="h", status_code=202, response={"id": "x"},
                          created_at=NOW),
    ]


def stored() -> dict[str, list[dict[str, Any]]]:
    # Every column but the tables' own serial ids (a message's id is the one the test gave).
    return {
        model.__name__: [{k: v for k, v in row.items() if model is Message or k != "id"}
                         for row in model.objects.order_by("pk").values()]
        for model in TABLES
    }


def saved_by_django(written: list[Any], claim: IdempotencyRecord) -> None:
    """The plain Django way of writing the same rows: save() of each, the claim first, in one transaction."""
    with transaction.atomic():
        claim.save(force_insert=True)
        for obj in written:
            obj.save(force_insert=True)


def both_ways(alice: Any, instance: Any, **changes: Any) -> list[tuple[dict[str, Any], list[tuple[str, bool]]]]:
    """What the one statement stores and signals, then what save() does, for the same objects."""
    message_id = uuid.uuid4()
    results = []
    for one_statement in (True, False):
        signals: list[tuple[str, bool]] = []

        def heard(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
            signals.append((sender.__name__, created))

        post_save.connect(heard, weak=False)
        try:
            with mock.patch("django.utils.timezone.now", return_value=NOW):  # auto_now columns
                *written, claim = rows(alice, instance, message_id, **changes)
                if one_statement:
                    assert inserts.insert_rows(written, claim, NOW - timedelta(hours=24))
                else:
                    saved_by_django(written, claim)
        finally:
            post_save.disconnect(heard)
        assert all(not obj._state.adding for obj in [*written, claim])  # stored, as save() leaves them
        results.append((stored(), signals))
        for model in reversed(TABLES):
            model.objects.all().delete()
    return results


def test_every_row_of_an_accept_is_stored_as_save_stores_it(alice, alice_instance):
    one_statement, orm = both_ways(alice, alice_instance)
    assert one_statement == orm
    assert one_statement[1] == [("IdempotencyRecord", True), ("Message", True), ("MessageEvent", True),
                                ("OutboxEntry", True)]
    assert one_statement[0]["Message"][0]["metadata"] == {"k": [1, None], "é": "ü"}


OTHER_VALUES = [
    {"status": Status.QUEUED, "category": "OTP", "priority": "urgent"},
    {"requested_instance": "alice-main", "api_key_id": None, "failure_detail": ""},
    {"lease_token": uuid.uuid4()},
    {"deliver_until": NOW.astimezone(timezone.get_fixed_timezone(-180))},
    {"sent_at": NOW, "last_gateway_response": {"status": 201}},
    # Columns with a database default, each away from it: written, not left to the database.
    {"status": Status.SENT, "attempts": 3, "failure_reason": "EXPIRED", "failure_detail": "x", "typing": "off",
     "callback_url": "https://example.com/cb", "evolution_message_id": "E1", "own_message_id": "O1",
     "remote_jid": "5511@s.whatsapp.net"},
]


@pytest.mark.parametrize("changes", OTHER_VALUES)
def test_other_values_are_stored_as_save_stores_them(alice, alice_instance, changes):
    one_statement, orm = both_ways(alice, alice_instance, **changes)
    assert one_statement == orm


def test_a_naive_datetime_is_made_aware_as_save_makes_it(alice, alice_instance):
    naive = datetime(2030, 1, 1, 12, 0)
    with pytest.warns(RuntimeWarning, match="naive datetime"):
        one_statement, orm = both_ways(alice, alice_instance, deliver_until=naive)
    assert one_statement == orm
    assert one_statement[0]["Message"][0]["deliver_until"] == timezone.make_aware(naive)


@pytest.mark.parametrize(
    "extra",
    [{}, {"instance": "alice-main", "priority": Priority.URGENT, "typing": "off", "callback_url": "https://example.com/" + "c" * 200,
          "metadata": {"order": "A-1"}, "variables": {"n": "1"}, "template": "Hi {{n}}"}],
    ids=["plain", "every-field"],
)
def test_an_accept_statement_stays_in_psycopgs_statement_cache(alice, alice_instance, extra):
    """psycopg parses a statement's placeholders again on every execute unless it is at most 4096 bytes with at
    most 50 parameters: an accept's one statement (the claim of its Idempotency-Key, the remembered choice's
    guard and its four rows) stays within both."""
    key = ApiKey.objects.get(project=alice.project, environment="LIVE")
    opt_ins.record(alice.project, "+5511988887777", "form")
    statements: list[tuple[str, list[Any]]] = []
    execute = prepared._PreparedCursor.execute

    def noted(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        statements.append((query, params))
        return execute(self, query, params, **kwargs)

    with mock.patch.object(prepared._PreparedCursor, "execute", noted):
        for i in range(3):  # the first reads the funnel's facts; the next write on the remembered ones, guarded
            req = SendRequest(**{"to": "+5511988887777", "category": "UTILITY", "template": "hi", **extra})
            accept_message(alice.project, key, "LIVE", req, idempotency_key=f"k-{i}", request_hash="h")
    accepts = [(query, params) for query, params in statements if "INSERT INTO" in query]
    assert len(accepts) == 3 and any("guard AS" in query for query, _ in accepts)
    for query, params in accepts:
        assert len(params) <= MAX_CACHED_STATEMENT_PARAMS, query
        assert len(query.encode()) <= MAX_CACHED_STATEMENT_LENGTH, len(query.encode())


@pytest.mark.parametrize("changes", [{}, *OTHER_VALUES])
def test_an_insert_text_written_once_per_shape_gives_what_the_compiler_gives(alice, alice_instance, changes):
    """A row's INSERT text is Django's compiler's, kept per shape; a later row of the same shape only has its values
    prepared. Both must be exactly what the compiler writes for that row."""
    with mock.patch("django.utils.timezone.now", return_value=NOW):
        *written, claim = rows(alice, alice_instance, uuid.uuid4(), **changes)
        for obj, source, conflict in [(claim, "guard", inserts._CLAIM_CONFLICT), *((o, "claim", {}) for o in written)]:
            inserts._statements.clear()
            compiled = comparable(inserts._insert(obj, source, **conflict))
            assert len(inserts._statements) == 1
            assert comparable(inserts._insert(obj, source, **conflict)) == compiled


def comparable(insert: tuple[str, list[Any]]) -> tuple[str, list[tuple[str, Any]]]:
    # A psycopg wrapper (Jsonb) compares by identity: compare its type and what it wraps.
    statement, params = insert
    return statement, [(type(p).__name__, getattr(p, "obj", p)) for p in params]


def test_a_row_with_an_expression_is_compiled_every_time(alice, alice_instance):
    """An expression writes SQL of its own (Now() is not a placeholder): such a row is never kept as a shape."""
    from django.db.models.functions import Now

    *written, claim = rows(alice, alice_instance, uuid.uuid4(), created_at=Now())
    inserts._statements.clear()
    for _ in range(2):
        statement, _ = inserts._insert(written[0], None)
        assert "STATEMENT_TIMESTAMP()" in statement and not inserts._statements
