"""The hot paths' prepared cursor: one kept per connection, never shared by two open blocks."""

from __future__ import annotations

import pytest
from django.db import DataError, connection, transaction

from messaging.prepared import prepared_cursor


def one(sql: str, params: list) -> tuple:
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone(), cursor.cursor


def test_statements_in_a_row_reuse_the_connection_s_cursor(db):
    first, raw_first = one("SELECT %s::int + 1", [1])
    second, raw_second = one("SELECT %s::text || 'b'", ["a"])
    assert (first, second) == ((2,), ("ab",))
    assert raw_first is raw_second and not raw_second.closed


def test_a_block_opened_inside_another_gets_its_own_cursor(db):
    with prepared_cursor() as outer:
        outer.execute("SELECT generate_series(1, %s::int)", [3])
        inner_row, inner_raw = one("SELECT %s::int * 10", [7])
        assert inner_raw is not outer.cursor and inner_raw.closed  # a nested one is closed after use
        assert outer.fetchall() == [(1,), (2,), (3,)]  # the outer rows were not replaced
    assert inner_row == (70,)
    assert one("SELECT 1", [])[1] is outer.cursor  # the kept one is free again


def test_after_a_failed_statement_the_cursor_still_serves(db):
    with pytest.raises(DataError), transaction.atomic():
        one("SELECT 1 / %s::int", [0])
    assert one("SELECT %s::int", [5])[0] == (5,)


def test_a_new_connection_gets_a_new_cursor(transactional_db):
    _, before = one("SELECT 1", [])
    connection.close()
    row, after = one("SELECT %s::int", [2])
    assert row == (2,) and after is not before

