"""The health governor's signals where the product learns them (messaging.governor): a send to a cold contact and
an ERROR receipt on it, connection.update events and opt-out replies through the real ingestion handlers, and a
"Connection Closed" answer from the simulator; each is judged at once for its number."""

from __future__ import annotations

from datetime import timedelta
from itertools import count

import pytest
from django.utils import timezone

from ingestion import handlers
from messaging import dispatch
from messaging.models import Instance, InstanceHealthEvent, InstanceSignal, Message, OutboxEntry, SendSchedule
from messaging.sending import instance_state, worker
from tests.conftest import add_instance
from tests.ingestion.helpers import receipt, sample
from tests.ingestion.test_inbound_opt_out import inbound
from tests.messaging.sending_helpers import open_on_simulator, queue, sends_ok

pytestmark = pytest.mark.usefixtures("empty_lanes")

_SECONDS = count()


@pytest.fixture
def number(alice):
    return add_instance(alice.project, "alice-phone", priority=10, profile="unofficial")


def history(number) -> list[tuple[str, str, str]]:
    return [(e.from_state, e.to_state, e.reason)
            for e in InstanceHealthEvent.objects.filter(instance=number).order_by("at", "id")]


def connection_update(number, state: str, reason: int) -> str:
    """A connection.update as Evolution sends it, each one stamped later than the one before."""
    payload = sample("webhook.connection.update.close.json", number.name, state=state, statusReason=reason)
    payload["data"]["instance"] = number.name
    at = timezone.now() + timedelta(milliseconds=next(_SECONDS))
    payload["date_time"] = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return handlers.ingest("WEBHOOK", payload)


def send_now(alice, to: str | None = None) -> Message:
    [message_id] = queue(alice, "UTILITY", 1, to=to)
    dispatch.release_due(lanes=("utility",))
    assert worker.send_one(message_id) == "sent"
    return Message.objects.get(pk=message_id)


def test_an_error_receipt_on_a_send_to_a_cold_contact_starts_a_cooling_period(simulator, alice, number):
    open_on_simulator(simulator, number)
    message = send_now(alice, to="+5511977776666")  # a recipient the number never talked with
    assert InstanceSignal.objects.filter(instance=number, kind="cold_send", message_id=message.pk).exists()

    assert handlers.ingest("WEBHOOK", receipt("ERROR", message.evolution_message_id, number.name)) == "failed"
    number.refresh_from_db()
    assert number.health_state == "at_risk" and number.cold_paused_until > timezone.now() + timedelta(hours=23)
    assert history(number) == [("healthy", "at_risk", "cold_contact_errors")]
    # The same receipt again (the other channel) is no second strike.
    handlers.ingest("WEBHOOK", receipt("ERROR", message.evolution_message_id, number.name, channel="rabbitmq"))
    assert InstanceSignal.objects.filter(instance=number, kind="cold_error").count() == 1

    # The next cold contact waits for the end of the cooling period; the number still writes to known ones.
    [cold] = queue(alice, "UTILITY", 1, to="+5511966665555")
    Message.objects.filter(pk=cold).update(deliver_until=timezone.now() + timedelta(days=3))
    SendSchedule.objects.filter(instance=number).update(next_send_at=None)
    assert dispatch.release_due(lanes=("utility",)).released == 0  # the relay knows it is a cold contact
    assert Message.objects.get(pk=cold).hold_reason.split("|")[0] == "cooling"


def test_an_error_receipt_on_a_known_contact_is_no_strike(simulator, alice, number):
    open_on_simulator(simulator, number)
    first = send_now(alice)
    SendSchedule.objects.filter(instance=number).update(next_send_at=None)
    second = send_now(alice)  # the same recipient: no longer a cold contact
    assert not InstanceSignal.objects.filter(message_id=second.pk).exists()
    assert handlers.ingest("WEBHOOK", receipt("ERROR", second.evolution_message_id, number.name)) == "failed"
    assert Instance.objects.get(pk=number.pk).health_state == "healthy"
    assert first.pk != second.pk


def test_a_logout_rests_the_number_and_a_ban_restricts_it(number):
    assert connection_update(number, "close", 401) == "state_changed"
    number.refresh_from_db()
    assert (number.health_state, number.connection_reason) == ("resting", 401)
    assert connection_update(number, "close", 403) == "state_unchanged"
    assert history(number) == [("healthy", "resting", "logout"), ("resting", "restricted", "banned")]


def test_a_storm_of_disconnects_rests_the_number(number):
    for _ in range(3):
        connection_update(number, "connecting", 428)
        connection_update(number, "open", 200)
    assert Instance.objects.get(pk=number.pk).health_state == "resting"
    assert history(number) == [("healthy", "resting", "disconnect_storm")]
    assert InstanceSignal.objects.filter(instance=number, kind="disconnect").count() == 3


def test_a_send_that_meets_connection_closed_is_a_disconnect(simulator, alice, number):
    open_on_simulator(simulator, number)
    [message_id] = queue(alice, "UTILITY", 1)
    dispatch.release_due(lanes=("utility",))
    # Our cached view says open; the gateway's session is gone.
    instance_state.remember(number.name, "open")
    simulator.instance(number.name, state="close")
    assert worker.send_one(message_id) == "waiting"
    signal = InstanceSignal.objects.get(instance=number, kind="disconnect")
    assert signal.detail == {"source": "send"}
    assert sends_ok(simulator, number.name) == []


def test_opt_out_replies_above_the_share_put_the_number_at_risk(alice, number):
    SendSchedule.objects.create(instance=number, day_started_at=timezone.now() - timedelta(hours=1), day_sent=30)
    assert handlers.ingest("WEBHOOK", inbound("STOP", instance=number.name)) == "opt_out_not_opted_in"
    # The same person again is one opt-out.
    handlers.ingest("WEBHOOK", inbound("SAIR", instance=number.name))
    assert InstanceSignal.objects.filter(instance=number, kind="opt_out").count() == 1
    assert Instance.objects.get(pk=number.pk).health_state == "healthy"  # 1 of 30 sends: below the share (5 %)
    handlers.ingest("WEBHOOK", inbound("Parar", jid="5511988886666@s.whatsapp.net", instance=number.name))
    assert Instance.objects.get(pk=number.pk).health_state == "at_risk"
    assert history(number) == [("healthy", "at_risk", "opt_outs")]


def test_a_text_that_is_no_keyword_is_no_signal(alice, number):
    handlers.ingest("WEBHOOK", inbound("Obrigado!", instance=number.name))
    assert not InstanceSignal.objects.filter(instance=number).exists()
    assert not OutboxEntry.objects.exists()


def test_a_fault_of_the_governor_never_undoes_the_receipt(simulator, alice, number, monkeypatch, caplog):
    from messaging import governor

    open_on_simulator(simulator, number)
    message = send_now(alice, to="+5511977776666")

    def broken(instance_id, now=None):
        raise RuntimeError("the governor is broken")

    monkeypatch.setattr(governor, "evaluate", broken)
    assert handlers.ingest("WEBHOOK", receipt("ERROR", message.evolution_message_id, number.name)) == "failed"
    assert Message.objects.get(pk=message.pk).status == "FAILED"
    assert not InstanceSignal.objects.filter(kind="cold_error").exists()  # the signal's savepoint rolled back
    assert "health signal error_receipt" in caplog.text and "the governor is broken" in caplog.text
    monkeypatch.undo()
    # The pass judges the number again (here: nothing to judge; the strike was lost with its savepoint, and said so).
    assert governor.run_pass() == 0
