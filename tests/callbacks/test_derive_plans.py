"""The relay pass reads only the rows that owe a callback, whatever Postgres' statistics say (issue 23).

Bench B3 empties the tables (TRUNCATE, then ANALYZE) and writes a 50,000-message marketing backlog: 50,000
ACCEPTED lines before the first status change, and receipts fill the inbox. A pass that read every line
and dropped the others in Python delivered no callback in the measured window. Each source is now read
through a partial index (event_status_lines, ingest_upserts, optin_revoked), and these tests EXPLAIN
ANALYZE its statement with statistics blind to what was just written, two ways: analyzed while the bulk
insert was uncommitted (autovacuum's view: no row over many pages), and analyzed empty right after a
TRUNCATE. The rows each plan node reads are counted, not guessed.

The statements go through Django's cursor (client-side binding, never prepared): a generic plan cannot
happen to them, and the last test holds that.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from callbacks import derive, derive_events
from callbacks.models import WebhookEndpoint
from ingestion.models import IngestionEvent
from messaging.models import Environment, Message, MessageEvent, OptIn

pytestmark = [pytest.mark.django_db(transaction=True)]

MESSAGES = 2_000
OTHER_LINES = 10  # per message: 20,000 lines that owe nothing
STATUS_LINES = 25
RECEIPTS = 20_000
UPSERTS = 5
LIVE_OPT_INS = 5_000
REVOKED = 3


def _other_session() -> psycopg.Connection[Any]:
    db = settings.DATABASES["default"]
    return psycopg.connect(dbname=db["NAME"], user=db["USER"], password=db["PASSWORD"], host=db["HOST"],
                           port=db["PORT"], autocommit=True)


def blind_statistics(tables: list[str], how: str, fill: Callable[[], None]) -> None:
    """`fill()` the tables so that their statistics know nothing of it (`how`)."""
    if how == "analyzed_empty_after_truncate":
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
            for table in tables:
                cursor.execute(f"ANALYZE {table}")
        fill()
        return
    with transaction.atomic():
        fill()
        with _other_session() as analyzer:  # autovacuum's view: pages, but no committed row
            for table in tables:
                analyzer.execute(f"ANALYZE {table}")


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def explain(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        found = cursor.fetchone()[0]
    plan = json.loads(found) if isinstance(found, str) else found
    return list(nodes(plan[0]["Plan"]))


def scans_of(plan: list[dict[str, Any]], table: str) -> list[dict[str, Any]]:
    return [node for node in plan if node.get("Relation Name") == table]


def rows_read(node: dict[str, Any]) -> int:
    loops = int(node.get("Actual Loops", 1))
    return int(node["Actual Rows"] + node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)) * loops


def index_names(plan: list[dict[str, Any]]) -> set[str]:
    return {node["Index Name"] for node in plan if "Index Name" in node}


HOW = ["analyzed_while_uncommitted", "analyzed_empty_after_truncate"]


@pytest.mark.parametrize("how", HOW)
def test_the_status_read_reads_only_status_lines_and_their_messages(alice, alice_instance, how):
    def fill() -> None:
        deliver_until = timezone.now() + timedelta(hours=4)
        messages = Message.objects.bulk_create(
            Message(project=alice.project, environment=Environment.LIVE, category="MARKETING", to="+5511988887777",
                    template="hi", text="hi", instance=alice_instance, deliver_until=deliver_until)
            for _ in range(MESSAGES)
        )
        MessageEvent.objects.bulk_create(
            (MessageEvent(message=m, kind="ACCEPTED" if n % 2 else "DISPATCHED", detail={})
             for n in range(OTHER_LINES) for m in messages),
            batch_size=5000,
        )
        MessageEvent.objects.bulk_create(
            MessageEvent(message=m, kind="STATUS", detail={"status": "SENT"}) for m in messages[-STATUS_LINES:]
        )

    blind_statistics(["messaging_message", "messaging_messageevent"], how, fill)

    plan = explain(derive_events._STATUS_READ, {"after": 0, "seen": [], "batch": derive_events.BATCH})

    # Only the status lines are read (in id order through the index, or all those past the cursor and
    # sorted: either way none of the 20,000 others), and each line's message by its primary key.
    (lines,) = scans_of(plan, "messaging_messageevent")
    assert lines["Node Type"] != "Seq Scan" and rows_read(lines) == STATUS_LINES, plan
    assert index_names(plan) == {"event_status_lines", "messaging_message_pkey"}, plan
    (messages,) = scans_of(plan, "messaging_message")
    assert messages["Node Type"] == "Index Scan" and messages["Index Cond"] == "(id = e.message_id)", plan
    assert rows_read(messages) == STATUS_LINES, plan


@pytest.mark.parametrize("how", HOW)
def test_the_inbound_read_reads_only_upserts(alice, alice_instance, how):
    def fill() -> None:
        IngestionEvent.objects.bulk_create(
            (IngestionEvent(dedup_key=f"r{n:063d}", channel="WEBHOOK", event="messages.update", key_id=f"3EB0R{n}",
                            instance_name=alice_instance.name, payload={"event": "messages.update", "data": {}})
             for n in range(RECEIPTS)),
            batch_size=5000,
        )
        IngestionEvent.objects.bulk_create(
            IngestionEvent(dedup_key=f"u{n:063d}", channel="WEBHOOK", event="messages.upsert", key_id=f"3EB0U{n}",
                           instance_name=alice_instance.name, payload={"event": "messages.upsert", "data": {}})
            for n in range(UPSERTS)
        )

    blind_statistics(["evolution_ingestion_events"], how, fill)

    plan = explain(derive_events._INBOUND_READ, {"after": 0, "seen": [], "batch": derive_events.BATCH})

    (inbox,) = scans_of(plan, "evolution_ingestion_events")
    assert inbox["Node Type"] != "Seq Scan" and "ingest_upserts" in index_names(plan), plan
    assert rows_read(inbox) == UPSERTS, plan


@pytest.mark.parametrize("how", HOW)
def test_the_opt_out_read_reads_only_revocations(alice, how):
    def fill() -> None:
        now = timezone.now()
        OptIn.objects.bulk_create(
            OptIn(project=alice.project, phone=f"+55119{n:08d}", source="form", revoked_at=now if n < REVOKED else None)
            for n in range(LIVE_OPT_INS + REVOKED)
        )

    blind_statistics(["messaging_optin"], how, fill)

    plan = explain(derive_events._OPT_OUT_READ, {"since": timezone.now() - timedelta(minutes=5), "until": timezone.now(), "batch": derive_events.BATCH})

    (opt_ins,) = scans_of(plan, "messaging_optin")
    assert "Seq Scan" not in opt_ins["Node Type"] and index_names(plan) == {"optin_revoked"}, plan
    assert rows_read(opt_ins) == REVOKED, plan


def test_the_passes_statements_are_never_prepared(alice, alice_instance):
    # A prepared statement's generic plan is made once, with no values: the partial indexes and the
    # primary-key reach above depend on planning each read with its own (prepare_threshold is 5).
    WebhookEndpoint.objects.create(project=alice.project, url="http://127.0.0.1:9/hook",
                                   event_types=["message.status", "message.inbound", "opt_in.revoked"])
    message = Message.objects.create(project=alice.project, environment=Environment.LIVE, category="UTILITY",
                                     to="+5511988887777", text="hi", instance=alice_instance,
                                     deliver_until=timezone.now() + timedelta(hours=1))

    def prepared() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            return int(cursor.fetchone()[0])

    derive.run()
    before = prepared()
    for n in range(10):
        MessageEvent.objects.create(message=message, kind="STATUS", detail={"status": "SENT"})
        derive.run()

    assert prepared() == before
