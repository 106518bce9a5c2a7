"""The health governor on Postgres (messaging.governor): the signals it records move a number's health state, each
change is one InstanceHealthEvent, and an operator's override is logged with the operator's name."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from messaging import governor
from messaging.models import Instance, InstanceHealthEvent, InstanceSignal, Message, SendSchedule, SignalKind, Status
from tests.conftest import add_instance
from tests.messaging.sending_helpers import queue


@pytest.fixture
def number(alice):
    return add_instance(alice.project, "alice-phone", priority=10, profile="unofficial")


def history(number) -> list[tuple[str, str, str, str]]:
    return [(e.from_state, e.to_state, e.reason, e.actor)
            for e in InstanceHealthEvent.objects.filter(instance=number).order_by("at", "id")]


def connection_update(number, state: str, reason: int) -> None:
    number.refresh_from_db()
    changed = number.set_connection_state(state)
    governor.connection(number, state, reason, changed)


def test_a_logout_rests_the_number_and_a_ban_restricts_it(number):
    connection_update(number, "close", 401)
    number.refresh_from_db()
    assert number.health_state == "resting" and number.connection_reason == 401
    assert history(number) == [("healthy", "resting", "logout", "governor")]
    assert set(InstanceSignal.objects.filter(instance=number).values_list("kind", flat=True)) == {"disconnect", "logout"}

    connection_update(number, "close", 403)
    number.refresh_from_db()
    assert number.health_state == "restricted"
    assert history(number)[-1] == ("resting", "restricted", "banned", "governor")


def test_a_disconnect_storm_rests_the_number_then_it_ramps_back_and_recovers(number, settings):
    for _ in range(3):
        connection_update(number, "connecting", 428)
        connection_update(number, "open", 200)
    number.refresh_from_db()
    assert number.health_state == "resting"
    assert history(number) == [("healthy", "resting", "disconnect_storm", "governor")]

    # A day of policy time later (compressed), connected and quiet: it ramps back at risk, then recovers.
    settings.SENDING_POLICY_TIME_SCALE = 86400.0
    later = timezone.now() + timedelta(seconds=1.5)
    assert governor.run_pass(later) == 1
    number.refresh_from_db()
    assert (number.health_state, history(number)[-1][2]) == ("at_risk", "ramp_back")
    assert governor.run_pass(later + timedelta(seconds=4)) == 1
    number.refresh_from_db()
    assert (number.health_state, history(number)[-1][2]) == ("healthy", "recovered")


def test_a_send_that_meets_connection_closed_counts_once_per_debounce(number):
    for _ in range(5):
        governor.connection_closed(number.pk)
    assert InstanceSignal.objects.filter(instance=number, kind="disconnect").count() == 1


def test_an_error_receipt_on_a_cold_send_starts_a_cooling_period(alice, number):
    warm, cold = (Message.objects.get(pk=i) for i in queue(alice, "UTILITY", 2))
    Message.objects.filter(pk__in=[warm.pk, cold.pk]).update(instance=number)
    warm.refresh_from_db()
    cold.refresh_from_db()
    governor.error_receipt(warm)  # not a cold send: nothing
    assert Instance.objects.get(pk=number.pk).health_state == "healthy"

    governor.cold_send(number.pk, cold.pk)
    governor.error_receipt(cold)
    number.refresh_from_db()
    assert number.health_state == "at_risk"
    assert number.cold_paused_until > timezone.now() + timedelta(hours=23)
    event = InstanceHealthEvent.objects.get(instance=number)
    assert (event.reason, event.evidence["errors"], event.cold_paused_until) == (
        "cold_contact_errors", 1, number.cold_paused_until)


def test_a_high_share_of_unacknowledged_sends_puts_the_number_at_risk_in_the_pass(alice, number):
    now = timezone.now()
    SendSchedule.objects.create(instance=number, day_started_at=now - timedelta(hours=1), day_sent=10)
    ids = queue(alice, "UTILITY", 2)
    Message.objects.filter(pk__in=ids).update(instance=number, status=Status.SENT, sent_at=now - timedelta(minutes=30),
                                              unacknowledged_at=now - timedelta(minutes=5))
    assert governor.run_pass() == 1
    number.refresh_from_db()
    assert number.health_state == "at_risk"
    event = InstanceHealthEvent.objects.get(instance=number)
    assert event.reason == "unacknowledged_sends" and event.evidence["unacknowledged"] == 2


def test_opt_outs_above_the_share_put_the_number_at_risk(number):
    SendSchedule.objects.create(instance=number, day_started_at=timezone.now() - timedelta(hours=1), day_sent=10)
    governor.opt_out(number.name, "+5511999990001")
    assert Instance.objects.get(pk=number.pk).health_state == "at_risk"
    assert history(number)[-1][2] == "opt_outs"


def test_a_logout_that_does_not_come_back_is_restricted_by_the_pass(number, settings):
    connection_update(number, "close", 401)
    settings.SENDING_POLICY_TIME_SCALE = 86400.0
    governor.run_pass(timezone.now() + timedelta(seconds=3))
    number.refresh_from_db()
    assert number.health_state == "restricted" and history(number)[-1][2] == "logout_not_back"


def test_an_operators_override_is_logged_and_holds(number):
    connection_update(number, "close", 403)
    assert Instance.objects.get(pk=number.pk).health_state == "restricted"
    event = governor.override(number, "healthy", "carol", "paired again by hand")
    assert event is not None and (event.actor, event.reason, event.evidence) == (
        "operator:carol", "operator", {"note": "paired again by hand"})
    number.refresh_from_db()
    assert number.health_state == "healthy" and number.health_override_until > timezone.now()
    # The still closed 403 moves nothing while the override holds.
    assert governor.evaluate(number.pk) == []
    with pytest.raises(ValueError):
        governor.override(number, "sideways", "carol")


def test_two_judges_record_one_change(number):
    stale = Instance.objects.get(pk=number.pk)
    assert governor._apply(stale, "resting", "logout", {}, None, "governor", timezone.now()) is not None
    assert governor._apply(stale, "resting", "logout", {}, None, "governor", timezone.now()) is None
    assert InstanceHealthEvent.objects.filter(instance=number).count() == 1


def test_old_signals_are_pruned_by_the_pass(number):
    InstanceSignal.objects.create(instance=number, kind=SignalKind.DISCONNECT, at=timezone.now() - timedelta(days=30),
                                  message_id=uuid.uuid4())
    governor.run_pass()
    assert not InstanceSignal.objects.filter(instance=number).exists()


def test_the_beat_task_runs_a_pass(number, settings):
    from messaging import tasks

    connection_update(number, "close", 401)
    settings.SENDING_POLICY_TIME_SCALE = 1e9  # a logout that did not come back for years
    assert tasks.govern_health() == 1
    assert Instance.objects.get(pk=number.pk).health_state == "restricted"
