"""Deliveries are derived from rows already committed (timeline, inbox, opt-ins): one per endpoint and
source, whatever the number of passes, and a row that commits late is not skipped."""

from __future__ import annotations


import psycopg
import pytest

from callbacks import derive, derive_events
from callbacks.models import Delivery, RelayCursor, WebhookEndpoint
from messaging import lifecycle, opt_ins
from messaging.models import FailureReason, Message, MessageEvent
from tests.messaging.sending_helpers import RECIPIENT, send
from tests.support.processes import test_database_url as database_url

# serial: a cursor moves on only once every transaction older than its read has ended, and Postgres' transaction
# ids are the whole server's: another xdist worker's open transaction, in its own database, holds it back.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("alice_instance"), pytest.mark.serial]


def endpoint_for(actor, *event_types: str) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(
        project=actor.project, url="http://127.0.0.1:9/hook", event_types=list(event_types or ["message.status"])
    )


def status_payloads(endpoint: WebhookEndpoint) -> list[dict]:
    rows = Delivery.objects.filter(endpoint=endpoint, event_type="message.status").order_by("source")
    return sorted((d.payload["data"] for d in rows), key=lambda data: data["sequence"])


def test_each_status_change_becomes_one_delivery_per_endpoint_even_when_the_pass_runs_twice(alice, carol):
    # given: two endpoints of alice's and one of carol's
    first, second = endpoint_for(alice), endpoint_for(alice)
    other = endpoint_for(carol)
    message = send(alice, metadata={"order": "42"})

    # when: the message moves SENT → DELIVERED and the pass runs, twice
    assert lifecycle.advance(message, "SENT") and lifecycle.advance(message, "DELIVERED")
    derive.run()
    derive.run()

    # then: each of alice's endpoints has each change once, in order, with its sequence
    for endpoint in (first, second):
        data = status_payloads(endpoint)
        assert [d["status"] for d in data] == ["SENT", "DELIVERED"]
        assert data[0]["sequence"] < data[1]["sequence"]
        assert {d["messageId"] for d in data} == {str(message.pk)}
        assert data[0]["metadata"] == {"order": "42"} and data[0]["to"] == RECIPIENT
        assert data[0]["failureReason"] is None
    assert not Delivery.objects.filter(endpoint=other).exists()
    assert Delivery.objects.count() == 4


def test_a_failure_carries_its_reason(alice):
    endpoint = endpoint_for(alice)
    message = send(alice)
    assert lifecycle.fail(message, FailureReason.INVALID_RECIPIENT, "not on WhatsApp")
    derive.run()
    (data,) = status_payloads(endpoint)
    assert data["status"] == "FAILED" and data["failureReason"] == "INVALID_RECIPIENT"


def test_an_endpoint_that_does_not_ask_for_the_type_gets_nothing(alice):
    endpoint_for(alice, "opt_in.revoked")
    lifecycle.advance(send(alice), "SENT")
    derive.run()
    assert not Delivery.objects.exists()


def uncommitted_status_line(message):
    """Another connection writes a status line for `message` (taking the next id) and does not commit yet:
    returns that connection (to commit or close) and the line's id."""
    late = psycopg.connect(database_url().replace("postgresql+psycopg", "postgresql"))
    with late.cursor() as cursor:
        cursor.execute(
            "INSERT INTO messaging_messageevent (message_id, kind, actor, detail, created_at) "
            "VALUES (%s, 'STATUS', '', '{\"status\": \"SERVER_ACK\"}', now()) RETURNING id",
            [message.pk],
        )
        return late, cursor.fetchone()[0]


def test_a_row_committed_late_with_a_smaller_id_is_not_skipped(alice):
    endpoint = endpoint_for(alice)
    message = send(alice)
    derive.run()  # the cursor is past everything so far

    # given: another connection writes a status line (taking the next id) and does not commit yet
    late, late_id = uncommitted_status_line(message)
    try:
        # when: a later line commits first and a pass runs, then the late one commits and a pass runs
        assert lifecycle.advance(message, "SENT")
        derive.run()
        seen_first = [d["sequence"] for d in status_payloads(endpoint)]
        assert RelayCursor.objects.get(name="timeline").position < late_id
        late.commit()
        derive.run()
    finally:
        late.close()

    # then: both arrived, the late one in the second pass
    assert late_id not in seen_first and len(seen_first) == 1
    assert sorted(d["sequence"] for d in status_payloads(endpoint)) == sorted([late_id, *seen_first])


def test_without_endpoints_the_cursors_move_on(alice):
    lifecycle.advance(send(alice), "SENT")
    derive.run()
    derive.run()
    assert not Delivery.objects.exists()
    # an endpoint created now starts from now, not from the beginning of the timeline
    endpoint = endpoint_for(alice)
    derive.run()
    assert not Delivery.objects.filter(endpoint=endpoint).exists()
    lifecycle.advance(send(alice, to="+5511988887778"), "SENT")
    derive.run()
    assert [d["status"] for d in status_payloads(endpoint)] == ["SENT"]


def test_a_revoked_opt_in_becomes_an_opt_in_revoked_delivery(alice):
    endpoint = endpoint_for(alice, "opt_in.revoked")
    opt_ins.record(alice.project, RECIPIENT, "signup form")
    derive.run()
    assert opt_ins.revoke(alice.project, RECIPIENT) is not None
    derive.run()
    derive.run()
    (delivery,) = Delivery.objects.filter(endpoint=endpoint)
    assert delivery.event_type == "opt_in.revoked"
    assert delivery.payload["data"]["phone"] == RECIPIENT and delivery.payload["data"]["revokedAt"]


def test_a_sends_callback_url_gets_its_status_changes_through_the_per_message_endpoint(alice):
    # no endpoint registered at all: the send's callbackUrl is enough
    message = send(alice, callbackUrl="https://hooks.example.com/pilot?order=42")
    other = send(alice, to="+5511988887778")
    assert Message.objects.get(pk=message.pk).callback_url == "https://hooks.example.com/pilot?order=42"
    lifecycle.advance(message, "SENT")
    lifecycle.advance(other, "SENT")
    derive.run()
    derive.run()
    (endpoint,) = WebhookEndpoint.objects.filter(project=alice.project)
    assert endpoint.per_message and endpoint.url == "" and endpoint.secret.startswith("whsec_")
    (delivery,) = Delivery.objects.all()
    assert delivery.url == "https://hooks.example.com/pilot?order=42"
    assert delivery.payload["data"]["messageId"] == str(message.pk) and delivery.payload["data"]["status"] == "SENT"

    listed = alice.client().get("/v1/webhook-endpoints").json()["data"]
    assert [e["perMessage"] for e in listed] == [True]
    fixed = alice.client().patch(f"/v1/webhook-endpoints/{endpoint.pk}", {"url": "https://x.example.com/"}, format="json")
    assert fixed.status_code == 400


@pytest.mark.parametrize("url", ["ftp://hooks.example.com/", "not a url", "https://" + "a" * 2050 + ".com/"])
def test_a_callback_url_that_is_not_http_is_refused_at_send(alice, url):
    opt_ins.record(alice.project, RECIPIENT, "signup form")
    response = alice.client().post(
        "/v1/messages/send", {"to": RECIPIENT, "category": "UTILITY", "text": "hi", "callbackUrl": url}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "callbackUrl" in response.json()["error"]["details"]["fields"]
    assert not Message.objects.exists()


def test_an_inbound_message_on_the_projects_instance_becomes_a_message_inbound_delivery(alice, alice_instance):
    from ingestion.models import IngestionEvent

    endpoint = endpoint_for(alice, "message.inbound")
    derive.run()

    def inbox(n: int, from_me: bool, instance: str) -> None:
        IngestionEvent.objects.create(
            dedup_key=f"{n:064d}", channel="WEBHOOK", event="messages.upsert", instance_name=instance, key_id=f"3EB0IN{n}",
            payload={"event": "messages.upsert", "instance": instance, "data": {
                "key": {"remoteJid": "5511988887777@s.whatsapp.net", "fromMe": from_me, "id": f"3EB0IN{n}"},
                "pushName": "Ana", "message": {"conversation": "STOP"}}},
        )

    inbox(1, False, alice_instance.name)
    inbox(2, True, alice_instance.name)  # our own send's echo: not inbound
    inbox(3, False, "someone-elses-instance")
    derive.run()
    derive.run()
    (delivery,) = Delivery.objects.filter(endpoint=endpoint)
    data = delivery.payload["data"]
    assert delivery.event_type == "message.inbound" and delivery.payload["type"] == "message.inbound"
    assert (data["from"], data["text"], data["pushName"], data["instance"], data["whatsappMessageId"]) == (
        "+5511988887777", "STOP", "Ana", alice_instance.name, "3EB0IN1"
    )


# --- under load: only the rows that owe a callback are read -----------------------------------------


def other_lines(message: Message, count: int) -> None:
    """`count` timeline lines that owe no callback (a marketing backlog's ACCEPTED and DISPATCHED)."""
    MessageEvent.objects.bulk_create(
        (MessageEvent(message=message, kind="ACCEPTED" if n % 2 else "DISPATCHED", detail={}) for n in range(count)),
        batch_size=5000,
    )


def status_lines(message: Message, count: int) -> list[int]:
    lines = MessageEvent.objects.bulk_create(
        MessageEvent(message=message, kind="STATUS", detail={"status": "SENT"}) for _ in range(count)
    )
    return [line.pk for line in lines]


def test_a_status_line_after_thousands_of_other_lines_is_delivered_by_one_pass(alice):
    # given: a pass has read everything so far, then 20 batches of lines that owe nothing, then one that does
    endpoint = endpoint_for(alice)
    message = send(alice)
    derive.run()
    other_lines(message, 20 * derive_events.BATCH)
    assert lifecycle.advance(message, "SENT")

    # when: one pass runs
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        done = derive.run(budget_seconds=60)

    # then: the SENT line's callback is owed, and the lines that owe nothing were passed over by the query,
    # not read batch after batch (a check on the work, not on a loaded machine's clock)
    assert [d["status"] for d in status_payloads(endpoint)] == ["SENT"] and done.status == 1
    timeline_reads = [q["sql"] for q in queries.captured_queries if "FROM messaging_messageevent" in q["sql"]]
    assert len(timeline_reads) <= 3, timeline_reads


def test_one_pass_goes_through_a_backlog_of_status_lines_batch_after_batch(alice, monkeypatch):
    monkeypatch.setattr(derive_events, "BATCH", 50)
    endpoint = endpoint_for(alice)
    message = send(alice)
    derive.run()
    ids = status_lines(message, 175)  # four reads of 50

    derive.run()

    assert sorted(d["sequence"] for d in status_payloads(endpoint)) == ids
    assert RelayCursor.objects.get(name="timeline").position == ids[-1]


def test_a_late_line_is_not_skipped_while_a_pass_reads_ahead_of_it(alice, monkeypatch):
    monkeypatch.setattr(derive_events, "BATCH", 2)
    endpoint = endpoint_for(alice)
    message = send(alice)
    derive.run()

    # given: an uncommitted status line, then seven committed ones after it (four reads of two)
    late, late_id = uncommitted_status_line(message)
    try:
        after = status_lines(message, 7)

        # when: a pass runs while it is open: it reads ahead, and its position waits before the late line
        derive.run()
        assert sorted(d["sequence"] for d in status_payloads(endpoint)) == after
        assert RelayCursor.objects.get(name="timeline").position < late_id
        late.commit()
        derive.run()
        derive.run()
    finally:
        late.close()

    # then: every line has its one delivery, and the position has moved past them all
    assert sorted(d["sequence"] for d in status_payloads(endpoint)) == sorted([late_id, *after])
    assert Delivery.objects.filter(endpoint=endpoint).count() == 8
    assert RelayCursor.objects.get(name="timeline").position == after[-1]


def test_an_inbound_message_after_thousands_of_receipts_is_delivered_by_one_pass(alice, alice_instance):
    from ingestion.models import IngestionEvent

    endpoint = endpoint_for(alice, "message.inbound")
    derive.run()
    IngestionEvent.objects.bulk_create(
        (IngestionEvent(dedup_key=f"r{n:063d}", channel="WEBHOOK", event="messages.update", instance_name=alice_instance.name,
                        key_id=f"3EB0R{n}", payload={"event": "messages.update", "data": {"status": "DELIVERY_ACK"}})
         for n in range(10 * derive_events.BATCH)),
        batch_size=5000,
    )
    IngestionEvent.objects.create(
        dedup_key="i" * 64, channel="WEBHOOK", event="messages.upsert", instance_name=alice_instance.name, key_id="3EB0IN1",
        payload={"event": "messages.upsert", "instance": alice_instance.name, "data": {
            "key": {"remoteJid": "5511988887777@s.whatsapp.net", "fromMe": False, "id": "3EB0IN1"},
            "message": {"conversation": "hello"}}},
    )

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        done = derive.run(budget_seconds=60)

    assert done.inbound == 1 and Delivery.objects.filter(endpoint=endpoint).count() == 1
    # The receipts are passed over by the query, not read batch after batch: the inbox is read a bounded
    # number of times, however many receipts come first (a check on the work, not on a slow machine's clock).
    inbox_reads = [q["sql"] for q in queries.captured_queries if "evolution_ingestion_events" in q["sql"]]
    assert len(inbox_reads) <= 3, inbox_reads


def test_a_source_no_endpoint_asks_for_is_not_read_and_its_cursor_moves_on(alice, alice_instance):
    from ingestion.models import IngestionEvent

    endpoint_for(alice, "message.status")  # no one wants message.inbound or opt_in.revoked
    inbox = IngestionEvent.objects.create(
        dedup_key="j" * 64, channel="WEBHOOK", event="messages.upsert", instance_name=alice_instance.name, key_id="3EB0IN2",
        payload={"event": "messages.upsert", "data": {"key": {"remoteJid": "5511988887777@s.whatsapp.net", "fromMe": False}}},
    )
    derive.run()
    assert RelayCursor.objects.get(name="inbox").position == inbox.pk
    assert not Delivery.objects.exists()
