"""The accept write's values are what Model.save() would send (bench B1).

messaging.accept._row skips get_db_prep_save() for values it hands to the driver unchanged
(text, UUIDs, aware datetimes); the oracle here is Django's own preparation of every column.
"""

from __future__ import annotations

import json
import uuid
import warnings
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.utils import timezone
from psycopg.types.json import Jsonb

from messaging.accept import _INSERTED, _row
from messaging.models import EventKind, IdempotencyRecord, Message, MessageEvent, OutboxEntry, Priority, Status

NOW = timezone.now()


def django_row(obj: Any) -> tuple[list[str], list[str], list[Any]]:
    columns, placeholders, values = [], [], []
    for column in _INSERTED[type(obj)]:
        f = column.field
        value = f.pre_save(obj, True)
        if value is None and f.null:
            continue
        columns.append(column.name)
        prepared = f.get_db_prep_save(value, connection)
        if isinstance(prepared, Jsonb):  # _row sends the same JSON text, cast in SQL
            placeholders.append("%s::jsonb")
            values.append((prepared.dumps or json.dumps)(prepared.obj))
        else:
            placeholders.append("%s")
            values.append(prepared)
    return columns, placeholders, values


def comparable(values: list[Any]) -> list[Any]:
    # Int8 & co. are ints with a type.
    return [(type(v), getattr(v, "obj", v)) for v in values]


def rows(alice: Any, instance: Any, **message_fields: Any) -> list[Any]:
    fields: dict[str, Any] = dict(
        project=alice.project, api_key=None, environment="LIVE", category="UTILITY", priority=Priority.NORMAL,
        to="+5511988887777", template="Hi {{n}}", variables={"n": 1}, text="Hi 1", metadata={"k": [1, None]},
        instance=instance, requested_instance="", deliver_until=NOW + timedelta(hours=1), next_attempt_at=NOW,
        max_attempts=10, created_at=NOW,
    )
    fields.update(message_fields)
    message = Message(**fields)
    return [
        message,
        MessageEvent(message=message, kind=EventKind.ACCEPTED, actor="ps_live_ab", detail={"instance": instance.name}),
        OutboxEntry(message=message, project_id_copy=alice.project.pk, lane="utility", priority=1, available_at=NOW),
        IdempotencyRecord(project=alice.project, key="k-1", request_hash="h", status_code=202, response={"id": "x"},
                          created_at=NOW),
    ]


def assert_as_django(obj: Any) -> None:
    with mock.patch("django.utils.timezone.now", return_value=NOW):  # auto_now columns
        table, placeholders, values = _row(obj, connection)
        columns, expected_placeholders, expected = django_row(obj)
    assert table == f"{obj._meta.db_table} ({', '.join(columns)})"
    assert placeholders == ", ".join(expected_placeholders)
    assert comparable(values) == comparable(expected)


def test_every_row_of_an_accept_is_prepared_as_django_prepares_it(alice, alice_instance):
    for obj in rows(alice, alice_instance):
        assert_as_django(obj)


@pytest.mark.parametrize(
    "changes",
    [
        {"status": Status.QUEUED, "category": "OTP", "priority": "urgent"},
        {"requested_instance": "alice-main", "api_key_id": None, "failure_detail": ""},
        {"id": uuid.UUID("12345678-1234-5678-1234-567812345678"), "lease_token": uuid.uuid4()},
        {"deliver_until": NOW.astimezone(timezone.get_fixed_timezone(-180))},
        {"sent_at": NOW, "last_gateway_response": {"status": 201}},
    ],
)
def test_other_values_are_prepared_as_django_prepares_them(alice, alice_instance, changes):
    assert_as_django(rows(alice, alice_instance, **changes)[0])


def test_a_naive_datetime_still_goes_through_django(alice, alice_instance):
    naive = datetime(2030, 1, 1, 12, 0)
    message = rows(alice, alice_instance, deliver_until=naive)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, values = _row(message, connection)
    assert naive not in values  # made aware, as save() does
    assert any(v == timezone.make_aware(naive) for v in values if isinstance(v, datetime))
    assert any("naive datetime" in str(w.message) for w in caught)
