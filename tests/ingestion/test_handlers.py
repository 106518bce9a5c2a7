"""The business logic of Evolution events, called directly: idempotent, forward only, by keyId."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from ingestion import handlers, inbox
from ingestion.models import IngestionEvent
from messaging import lifecycle
from messaging.inserts import enqueue
from messaging.models import Message, OutboxEntry, Status
from tests.ingestion.helpers import KEY_ID, make_message, rabbit_copy, receipt, sample


def ingest(payload):
    event, _ = inbox.record("WEBHOOK", payload)
    return handlers.apply(event), IngestionEvent.objects.get(pk=event.pk)


@pytest.fixture
def sent_message(alice, alice_instance):
    return make_message(alice.project, alice_instance)


def test_send_message_confirms_the_evolution_id(sent_message):
    outcome, event = ingest(sample("webhook.send.message.json"))
    assert outcome == "confirmed" and event.processed_at is not None
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


def test_played_counts_as_read(sent_message):
    assert ingest(receipt("PLAYED"))[0] == "applied"
    sent_message.refresh_from_db()
    assert sent_message.status == Status.READ


def test_an_error_receipt_fails_the_message_into_the_dead_letters(sent_message):
    outcome, _ = ingest(sample("webhook.messages.update.ERROR.json"))
    assert outcome == "failed"
    sent_message.refresh_from_db()
    assert sent_message.status == Status.FAILED
    assert sent_message.failure_reason == "REJECTED"
    assert sent_message.dead_letter.reason == "REJECTED"


def test_an_error_after_delivery_changes_nothing(sent_message):
    ingest(receipt("DELIVERY_ACK"))
    assert ingest(receipt("ERROR"))[0] == "stale"
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED


def test_it_matches_by_key_id_when_remote_jid_is_a_lid(sent_message):
    payload = receipt("DELIVERY_ACK")
    payload["data"]["remoteJid"] = "123456789012345@lid"
    assert ingest(payload)[0] == "applied"
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED


def test_a_receipt_for_another_instances_message_does_not_touch_it(sent_message, carol):
    from tests.conftest import add_instance

    add_instance(carol.project, "carol-main")
    outcome, event = ingest(receipt("READ", instance="carol-main"))
    assert outcome == handlers.WAITING and event.processed_at is None
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


RECEIPTS = {"SERVER_ACK": Status.SERVER_ACK, "DELIVERY_ACK": Status.DELIVERED, "READ": Status.READ}


@pytest.mark.parametrize("order", list(itertools.permutations(RECEIPTS)), ids="-".join)
def test_statuses_in_any_order_end_at_the_most_advanced(sent_message, order):
    # every order of the three receipts, then a repeat and a PENDING, which change nothing
    for status in (*order, order[0], "PENDING"):
        ingest(receipt(status))
    sent_message.refresh_from_db()
    assert sent_message.status == Status.READ
    # one STATUS line per receipt that moved the message forward, in the order they came
    rank = list(RECEIPTS)
    forward = [RECEIPTS[s] for n, s in enumerate(order) if all(rank.index(s) > rank.index(e) for e in order[:n])]
    timeline = [e.detail["status"] for e in sent_message.events.filter(kind="STATUS")]
    assert timeline == forward


def test_applying_an_event_twice_has_one_effect(sent_message):
    event, _ = inbox.record("WEBHOOK", receipt("SERVER_ACK"))
    assert handlers.apply(event) == "applied"
    assert handlers.apply(event) == handlers.ALREADY_PROCESSED
    assert sent_message.events.filter(kind="STATUS").count() == 1


@pytest.mark.parametrize(
    "name", ["webhook.messages.upsert.inbound-text.json", "webhook.messages.delete.json"]
)
def test_other_events_are_stored_and_processed_without_effect(sent_message, name):
    outcome, event = ingest(sample(name))
    assert outcome == "stored" and event.processed_at is not None
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


def test_an_event_of_an_unknown_instance_is_closed_at_once(db):
    outcome, event = ingest(receipt("READ", instance="nobody-knows"))
    assert outcome == "unknown_instance" and event.processed_at is not None


def test_an_ack_before_the_send_commit_is_applied_when_the_send_lands(alice, alice_instance):
    # given: the worker called sendText but has not committed SENT yet
    message = make_message(alice.project, alice_instance, status=Status.SENDING)
    outcome, event = ingest(receipt("DELIVERY_ACK"))
    assert outcome == handlers.WAITING and event.processed_at is None

    # when: its send commits
    lifecycle.mark_sent(message, None, KEY_ID, "5511999999999@s.whatsapp.net", {})

    # then: the waiting receipt is applied at once
    message.refresh_from_db()
    assert message.status == Status.DELIVERED
    event.refresh_from_db()
    assert event.processed_at is not None and event.outcome == "applied"


def test_a_receipt_nobody_claims_is_closed_after_an_hour(alice_instance):
    event, _ = inbox.record("WEBHOOK", receipt("READ", key_id="3EB0NOBODYSENTTHIS0000"))
    IngestionEvent.objects.filter(pk=event.pk).update(received_at=timezone.now() - timedelta(hours=2))
    assert handlers.apply(event) == "unmatched"


def connection_update(state: str, at: str, instance: str = "alice-main") -> dict:
    payload = sample(f"webhook.connection.update.{'open' if state == 'open' else 'close'}.json", instance, state=state)
    payload["date_time"] = at
    return payload


def test_connection_updates_record_each_transition_even_when_a_state_repeats(alice_instance):
    # open → close → open carries identical data twice: both opens must count.
    for state, at in (("open", "2025-10-21T11:00:00.000Z"), ("close", "2025-10-21T11:00:05.000Z"),
                      ("open", "2025-10-21T11:00:09.000Z")):
        ingest(connection_update(state, at))
        alice_instance.refresh_from_db()
        assert alice_instance.connection_state == state
    assert IngestionEvent.objects.filter(event="connection.update").count() == 3


def test_a_late_connection_update_does_not_undo_a_newer_one(alice_instance):
    ingest(connection_update("open", "2025-10-21T11:00:09.000Z"))
    outcome, _ = ingest(connection_update("close", "2025-10-21T11:00:05.000Z"))  # delayed copy
    assert outcome == "stale"
    alice_instance.refresh_from_db()
    assert alice_instance.connection_state == "open"


def test_a_reconnect_releases_the_messages_waiting_for_the_instance(alice, alice_instance):
    # given: the instance is down and a message waits for it (no attempt used)
    ingest(connection_update("close", "2025-10-21T11:00:00.000Z"))
    later = timezone.now() + timedelta(minutes=5)
    message = make_message(alice.project, alice_instance, status=Status.QUEUED, key_id="")
    Message.objects.filter(pk=message.pk).update(next_attempt_at=later)
    entry = enqueue(message, later)

    # when: Evolution reports it open again
    outcome, _ = ingest(connection_update("open", "2025-10-21T11:00:30.000Z"))

    # then: its outbox entry is due now
    assert outcome == "state_changed"
    entry = OutboxEntry.objects.get(pk=entry.pk)
    assert entry.available_at <= timezone.now()


def test_a_new_receipt_is_stored_and_applied_in_one_statement(sent_message):
    # handlers.ingest: the usual receipt (its message known) is one statement, so one commit
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert handlers.ingest("WEBHOOK", receipt("DELIVERY_ACK")) == "applied"
    assert len(queries) == 1  # not even a savepoint under the test's own transaction
    event = IngestionEvent.objects.get()
    assert event.channel == "WEBHOOK" and event.processed_at is not None and event.outcome == "applied"
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED and sent_message.delivered_at is not None
    assert sent_message.server_ack_at == sent_message.delivered_at  # implied by the overtaking receipt
    assert list(sent_message.events.values_list("kind", "detail")) == [
        ("STATUS", {"status": "DELIVERED", "source": "evolution", "evolutionStatus": "DELIVERY_ACK"})]
    assert handlers.ingest("RABBITMQ", rabbit_copy(receipt("DELIVERY_ACK"))) == handlers.ALREADY_PROCESSED
    assert handlers.ingest("WEBHOOK", receipt("SERVER_ACK")) == "stale"  # stored, processed, changes nothing
    assert IngestionEvent.objects.filter(outcome="stale", processed_at__isnull=False).count() == 1
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED


def test_any_other_new_event_is_stored_and_applied_in_one_transaction(sent_message):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert handlers.ingest("WEBHOOK", sample("webhook.connection.update.open.json")) == "state_unchanged"
    # one transaction: a single savepoint under the test's own transaction, and inside it the health signal's own
    # (messaging.governor.safely), released before the event's
    savepoints = [q["sql"] for q in queries if (q["sql"] or "").startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
    assert [sql.split()[0] for sql in savepoints] == ["SAVEPOINT", "SAVEPOINT", "RELEASE", "RELEASE"]
    assert IngestionEvent.objects.get().processed_at is not None


def test_a_send_confirmation_is_stored_processed_in_one_statement(sent_message):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert handlers.ingest("WEBHOOK", sample("webhook.send.message.json")) == "confirmed"
    assert len(queries) == 1
    event = IngestionEvent.objects.get()
    assert (event.event, event.outcome, event.processed_at is not None) == ("send.message", "confirmed", True)
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT and not sent_message.events.exists()
    assert handlers.ingest("RABBITMQ", rabbit_copy(sample("webhook.send.message.json"))) == handlers.ALREADY_PROCESSED


def test_a_confirmation_before_its_send_commits_waits_in_the_inbox(alice, alice_instance):
    assert handlers.ingest("WEBHOOK", sample("webhook.send.message.json")) == handlers.WAITING
    event = IngestionEvent.objects.get()
    assert event.processed_at is None and event.outcome == handlers.WAITING


def test_concurrent_copies_of_a_receipt_apply_it_once(transactional_db, alice, alice_instance):
    import threading

    from django.db import connection

    message = make_message(alice.project, alice_instance)
    payload = receipt("DELIVERY_ACK")
    outcomes: list[str | None] = []

    def webhook() -> None:  # Redis down: no lock filters the copies, the database decides
        outcomes.append(handlers.ingest("WEBHOOK", payload))

    def consumer() -> None:  # what the consumer and its forward do
        copy = rabbit_copy(payload)
        event, _ = inbox.record("RABBITMQ", copy)
        outcomes.append(handlers.apply_saved(event.dedup_key, copy))

    def closing(fn):
        def run() -> None:
            try:
                fn()
            finally:
                connection.close()
        return run

    threads = [threading.Thread(target=closing(fn)) for fn in [webhook, consumer] * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(outcomes) == 8 and outcomes.count("applied") == 1, outcomes
    assert set(outcomes) <= {"applied", "stale", handlers.ALREADY_PROCESSED}
    assert IngestionEvent.objects.count() == 1 and IngestionEvent.objects.get().processed_at is not None
    message.refresh_from_db()
    assert message.status == Status.DELIVERED
    assert message.events.filter(kind="STATUS").count() == 1


def test_a_receipt_whose_send_commits_while_it_looked_is_applied_by_the_second_look(alice, alice_instance, monkeypatch):
    # given: the receipt's message is not there when ingest looks inside its transaction ...
    message = make_message(alice.project, alice_instance, status=Status.SENDING, key_id="")
    real = handlers._message_for
    looks = []

    def racing_lookup(event):
        looks.append(event.pk)
        if len(looks) == 1:
            found = real(event)
            # ... and the send commits right then (its message_sent hook cannot see our row yet)
            Message.objects.filter(pk=message.pk).update(status=Status.SENT, evolution_message_id=KEY_ID)
            return found
        return real(event)

    monkeypatch.setattr(handlers, "_message_for", racing_lookup)

    # when
    outcome = handlers.ingest("WEBHOOK", receipt("DELIVERY_ACK"))

    # then: the look after the commit finds it and applies the receipt at once
    assert outcome == "applied"
    message.refresh_from_db()
    assert message.status == Status.DELIVERED
    assert IngestionEvent.objects.get().processed_at is not None


def test_a_handler_failure_keeps_the_raw_event_unprocessed(sent_message, monkeypatch):
    def broken(event):
        raise RuntimeError("bug in a handler")

    monkeypatch.setattr(handlers, "_effect", broken)
    with pytest.raises(RuntimeError):
        handlers.ingest("WEBHOOK", receipt("ERROR"))  # a receipt the one-statement path leaves to the handler

    event = IngestionEvent.objects.get()
    assert event.processed_at is None and event.channel == "WEBHOOK"  # the reconciler retries it
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


def test_a_forwarded_receipt_is_applied_in_one_statement(sent_message):
    # handlers.apply_saved (the consumer's forward): the row is saved unprocessed; finding the message, moving it
    # with its line and marking the row processed is one statement, as for the webhook's own copy.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    forwarded = rabbit_copy(receipt("DELIVERY_ACK"))
    event, _ = inbox.record("RABBITMQ", forwarded)

    with CaptureQueriesContext(connection) as queries:
        assert handlers.apply_saved(event.dedup_key, forwarded) == "applied"
    assert len(queries) == 1, [q["sql"] for q in queries]
    event.refresh_from_db()
    assert event.channel == "RABBITMQ" and event.processed_at is not None and event.outcome == "applied"
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED
    assert list(sent_message.events.values_list("kind", "detail")) == [
        ("STATUS", {"status": "DELIVERED", "source": "evolution", "evolutionStatus": "DELIVERY_ACK"})]
    # again: the row is processed, nothing moves twice
    assert handlers.apply_saved(event.dedup_key, forwarded) == handlers.ALREADY_PROCESSED
    assert sent_message.events.count() == 1


def test_a_forwarded_stale_receipt_and_send_confirmation_are_finished_in_one_statement(sent_message):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    handlers.ingest("WEBHOOK", receipt("READ"))
    late, sent = rabbit_copy(receipt("SERVER_ACK")), rabbit_copy(sample("webhook.send.message.json"))
    stale, _ = inbox.record("RABBITMQ", late)
    confirmation, _ = inbox.record("RABBITMQ", sent)

    with CaptureQueriesContext(connection) as queries:
        assert handlers.apply_saved(stale.dedup_key, late) == "stale"
        assert handlers.apply_saved(confirmation.dedup_key, sent) == "confirmed"
    assert len(queries) == 2, [q["sql"] for q in queries]
    assert set(IngestionEvent.objects.filter(channel="RABBITMQ").values_list("outcome", flat=True)) == {"stale", "confirmed"}
    assert not IngestionEvent.objects.filter(processed_at__isnull=True).exists()
    sent_message.refresh_from_db()
    assert sent_message.status == Status.READ and sent_message.events.count() == 1


def test_a_forwarded_receipt_whose_message_is_not_committed_yet_still_waits(alice, alice_instance):
    forwarded = rabbit_copy(receipt("DELIVERY_ACK"))
    event, _ = inbox.record("RABBITMQ", forwarded)

    assert handlers.apply_saved(event.dedup_key, forwarded) == handlers.WAITING
    event.refresh_from_db()
    assert event.processed_at is None and event.outcome == handlers.WAITING
