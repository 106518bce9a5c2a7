"""The harness's TRUNCATE (tests/support/database.py) names the sessions it waited for when it runs out of tries: a
bench or chaos run that stops there says which process kept its tables locked."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError

from pilot_status import beat_lock
from tests.support.database import truncate_with_retry


@pytest.mark.django_db(transaction=True)
def test_a_truncate_that_runs_out_of_tries_names_the_session_that_held_the_table() -> None:
    # given: another session in a transaction that holds a lock on the table
    with psycopg.connect(**{**beat_lock.connection_params(), "application_name": "holder-under-test"}) as holder:
        holder.execute("SELECT count(*) FROM messaging_outboxentry")  # opens the transaction, keeps ACCESS SHARE

        # when / then
        with pytest.raises(OperationalError) as raised:
            truncate_with_retry(["messaging_outboxentry"], tries=2, lock_timeout="100ms")
        assert "holder-under-test" in str(raised.value)
        assert "idle in transaction" in str(raised.value)
        holder.rollback()
