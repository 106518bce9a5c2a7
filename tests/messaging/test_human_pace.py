"""An unofficial number's human pace at the relay and in the worker (docs/sending-policy.md): one send at a time,
a jittered gap after each, caps with their warm-up, a cold-contact quota, OTPs first, and a held message that
says why, or fails EXPIRED naming the limit."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from messaging import dispatch, governor
from messaging.models import Contact, Instance, InstanceSignal, Message, OutboxEntry, SendSchedule
from messaging.sending import instance_state, worker
from tests.conftest import add_instance
from tests.messaging import sending_helpers
from tests.messaging.sending_helpers import events, open_on_simulator, queue, sends_ok

pytestmark = pytest.mark.usefixtures("empty_lanes")


@pytest.fixture
def number(alice):
    return add_instance(alice.project, "alice-phone", priority=10, profile="unofficial")


def release(lane: str = "utility") -> dispatch.Release:
    return dispatch.release_due(lanes=(lane,))


def body(alice, message_id: str) -> dict:
    return alice.client().get(f"/v1/messages/{message_id}").json()


def test_the_relay_releases_one_message_per_unofficial_number_and_holds_the_rest_with_why(alice, number):
    ids = queue(alice, "UTILITY", 4)
    started = timezone.now()
    result = release()
    assert result.released == 1 and result.held == 0  # the held ones are not due now: the relay does not spin
    schedule = SendSchedule.objects.get(instance=number)
    released = [i for i in ids if Message.objects.get(pk=i).dispatched_at is not None]
    assert len(released) == 1 and str(schedule.reserved_by) == released[0]
    for held in set(ids) - set(released):
        shown = body(alice, held)
        assert shown["waitingReason"] == "pacing"
        assert [line["detail"]["why"] for line in shown["events"] if line["type"] == "WAITING"] == ["pacing"]
        entry = OutboxEntry.objects.get(message_id=held)
        assert entry.available_at >= started + timedelta(seconds=5)
    # Held again for the same reason: no second line.
    OutboxEntry.objects.update(available_at=timezone.now())
    assert release().released == 0  # the number is still reserved for the first one
    assert all(len(events(Message.objects.get(pk=i), "WAITING")) == 1 for i in set(ids) - set(released))


def test_an_official_number_keeps_its_throughput(alice, alice_instance):
    queue(alice, "UTILITY", 5)
    assert release().released == 5


def test_the_worker_sends_in_the_slot_then_draws_a_jittered_gap(simulator, alice, number):
    open_on_simulator(simulator, number)
    first, second = queue(alice, "UTILITY", 2)
    release()
    sent = next(i for i in (first, second) if Message.objects.get(pk=i).dispatched_at is not None)
    before = timezone.now()
    assert worker.send_one(sent) == "sent"
    schedule = SendSchedule.objects.get(instance=number)
    assert schedule.reserved_by is None and (schedule.hour_sent, schedule.day_sent, schedule.day_cold) == (1, 1, 1)
    assert before + timedelta(seconds=5) <= schedule.next_send_at <= timezone.now() + timedelta(seconds=30)
    assert len(schedule.cold_sent_at) == 1 and before <= schedule.cold_sent_at[0] <= timezone.now()  # the last 24 h's
    assert Contact.objects.filter(instance=number, phone=alice.project.test_number, last_direction="outbound").exists()
    assert len(sends_ok(simulator, number.name)) == 1


def test_a_second_send_on_a_busy_number_waits_without_an_attempt(simulator, alice, number):
    open_on_simulator(simulator, number)
    first, second = queue(alice, "UTILITY", 2)
    SendSchedule.objects.create(instance=number, reserved_by=first,
                                reserved_until=timezone.now() + timedelta(minutes=1))
    assert worker.send_one(second) == "held"
    message = Message.objects.get(pk=second)
    assert (message.status, message.attempts, message.hold_reason.split("|")[0]) == ("QUEUED", 0, "pacing")
    assert sends_ok(simulator, number.name) == []


def test_a_new_numbers_hourly_cap_holds_as_warming_up_until_the_hour_ends(alice, number):
    now = timezone.now()
    SendSchedule.objects.create(instance=number, first_send_at=now, hour_started_at=now, hour_sent=20,
                                day_started_at=now, day_sent=20)
    [message_id] = queue(alice, "MARKETING", 1)
    assert release("marketing").released == 0
    assert body(alice, message_id)["waitingReason"] == "warming_up"
    entry = OutboxEntry.objects.get(message_id=message_id)
    assert abs((entry.available_at - (now + timedelta(hours=1))).total_seconds()) < 1


def test_a_message_the_policy_cannot_send_in_time_expires_naming_the_limit(alice, number):
    now = timezone.now()
    SendSchedule.objects.create(instance=number, first_send_at=now - timedelta(days=60), hour_started_at=now,
                                hour_sent=80, day_started_at=now, day_sent=80)
    [message_id] = queue(alice, "UTILITY", 1)
    Message.objects.filter(pk=message_id).update(deliver_until=now + timedelta(minutes=10))
    release()
    shown = body(alice, message_id)
    assert (shown["status"], shown["failureReason"]) == ("FAILED", "EXPIRED")
    assert "hourly_cap" in shown["failureDetail"]


def test_a_resting_number_holds_its_sends(alice, number):
    number.health_state = "resting"
    number.save(update_fields=["health_state"])
    [message_id] = queue(alice, "UTILITY", 1)
    assert release().released == 0
    assert body(alice, message_id)["waitingReason"] == "resting"


def test_a_number_the_governor_rests_holds_its_sends_from_the_next_claim(simulator, alice, number):
    open_on_simulator(simulator, number)
    [message_id] = queue(alice, "UTILITY", 1)
    assert release().released == 1
    # The governor rests it between the release and the claim (a logout): the claim reads the number's state now.
    number.refresh_from_db()
    governor.connection(number, "close", 401, number.set_connection_state("close"))
    instance_state.sync(number, "open")  # paired again: connected, and resting all the same
    assert Instance.objects.get(pk=number.pk).health_state == "resting"
    assert worker.send_one(message_id) == "held"
    assert body(alice, message_id)["waitingReason"] == "resting"
    assert sends_ok(simulator, number.name) == []


def test_a_restricted_number_holds_its_sends_as_restricted(alice, number):
    Instance.objects.filter(pk=number.pk).update(health_state="restricted")
    [message_id] = queue(alice, "UTILITY", 1)
    assert release().released == 0
    assert body(alice, message_id)["waitingReason"] == "restricted"


def test_a_resting_official_number_holds_its_sends_until_its_deadline_names_it(simulator, alice, alice_instance):
    from messaging import reconciler

    open_on_simulator(simulator, alice_instance)
    Instance.objects.filter(pk=alice_instance.pk).update(health_state="resting")
    [message_id] = queue(alice, "UTILITY", 1)
    assert release().released == 1  # an official number's relay paces its throughput: its worker asks its health
    assert worker.send_one(message_id) == "held"
    shown = body(alice, message_id)
    assert shown["waitingReason"] == "resting"
    assert [line["detail"]["why"] for line in shown["events"] if line["type"] == "WAITING"] == ["resting"]
    assert sends_ok(simulator, alice_instance.name) == []
    Message.objects.filter(pk=message_id).update(deliver_until=timezone.now())
    assert reconciler.expire_overdue() == 1
    shown = body(alice, message_id)
    assert (shown["status"], shown["failureReason"]) == ("FAILED", "EXPIRED") and "resting" in shown["failureDetail"]


def test_a_resting_official_numbers_held_send_holds_its_whole_backlog(simulator, alice, alice_instance, carol):
    # One claim's verdict on the number is the verdict on its due backlog. Without it, the relay released the
    # backlog at the number's pace and every message went through the broker and a worker to be held one at a time,
    # again each policy minute: a large backlog churned through the pipeline for as long as its number rested.
    open_on_simulator(simulator, alice_instance)
    Instance.objects.filter(pk=alice_instance.pk).update(health_state="resting")
    backlog = queue(alice, "UTILITY", 12)
    soon = backlog[0]
    Message.objects.filter(pk=soon).update(deliver_until=timezone.now() + timedelta(seconds=20))
    other_number = add_instance(carol.project, "carol-main")
    [elsewhere] = queue(carol, "UTILITY", 1)
    assert Message.objects.get(pk=elsewhere).instance_id == other_number.pk

    assert dispatch.release_due(limit=1, lanes=("utility",)).released == 1
    [first] = Message.objects.filter(pk__in=backlog, dispatched_at__isnull=False).values_list("pk", flat=True)
    assert worker.send_one(str(first)) == "held"

    assert release().released == 1  # carol's message only: the resting number's backlog waits in Postgres
    assert Message.objects.get(pk=elsewhere).dispatched_at is not None
    now = timezone.now()
    for message_id in backlog:
        shown = body(alice, message_id)
        assert shown["waitingReason"] == "resting"
        assert [line["detail"]["why"] for line in shown["events"] if line["type"] == "WAITING"] == ["resting"]
    due = dict(OutboxEntry.objects.filter(message_id__in=backlog).values_list("message_id", "available_at"))
    assert len(due) == 12 and all(at > now + timedelta(seconds=15) for at in due.values())
    assert due[uuid.UUID(soon)] <= Message.objects.get(pk=soon).deliver_until  # never past its deadline
    assert sends_ok(simulator, alice_instance.name) == []


def test_a_restricted_official_number_holds_its_sends_as_restricted(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance)
    Instance.objects.filter(pk=alice_instance.pk).update(health_state="restricted")
    [message_id] = queue(alice, "OTP", 1)
    assert release("otp").released == 1
    assert worker.send_one(message_id) == "held"
    assert body(alice, message_id)["waitingReason"] == "restricted"
    assert sends_ok(simulator, alice_instance.name) == []


def test_an_official_number_held_by_its_health_sends_again_once_healthy(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance)
    Instance.objects.filter(pk=alice_instance.pk).update(health_state="resting")
    [message_id] = queue(alice, "UTILITY", 1)
    release()
    assert worker.send_one(message_id) == "held"
    Instance.objects.filter(pk=alice_instance.pk).update(health_state="at_risk")  # the governor's ramp back
    OutboxEntry.objects.filter(message_id=message_id).update(available_at=timezone.now())
    Message.objects.filter(pk=message_id).update(next_attempt_at=timezone.now())
    assert release().released == 1
    assert worker.send_one(message_id) == "sent"


def test_an_official_number_deleted_at_the_gateway_fails_instance_not_found_though_its_logout_rests_it(
        simulator, alice, alice_instance):
    # Evolution logs a deleted instance out first (connection.update close 401): the governor rests the number. Its
    # messages still meet Evolution's 404 and fail INSTANCE_NOT_FOUND, not a hold that lasts until their deadline.
    alice_instance.refresh_from_db()
    governor.connection(alice_instance, "close", 401, alice_instance.set_connection_state("close"))
    assert Instance.objects.get(pk=alice_instance.pk).health_state == "resting"
    [message_id] = queue(alice, "UTILITY", 1)  # the simulator never heard of alice-main: 404 to every call
    assert release().released == 1
    assert worker.send_one(message_id) == "failed"
    message = Message.objects.get(pk=message_id)
    assert (message.status, message.failure_reason) == ("FAILED", "INSTANCE_NOT_FOUND")


def test_a_number_at_risk_sends_half_its_caps(alice, number):
    now = timezone.now()
    SendSchedule.objects.create(instance=number, first_send_at=now - timedelta(days=60), hour_started_at=now,
                                hour_sent=40, day_started_at=now, day_sent=40)
    [message_id] = queue(alice, "UTILITY", 1)
    Instance.objects.filter(pk=number.pk).update(health_state="at_risk")
    assert release().released == 0
    assert body(alice, message_id)["waitingReason"] == "hourly_cap"
    Instance.objects.filter(pk=number.pk).update(health_state="healthy")
    OutboxEntry.objects.filter(message_id=message_id).update(available_at=timezone.now())
    assert release().released == 1


def test_a_cooling_number_holds_cold_contacts_and_sends_to_known_ones(simulator, alice, number):
    open_on_simulator(simulator, number)
    until = timezone.now() + timedelta(hours=12)
    Instance.objects.filter(pk=number.pk).update(health_state="at_risk", cold_paused_until=until)
    [cold] = queue(alice, "UTILITY", 1, to="+5511977776666")
    Message.objects.filter(pk=cold).update(deliver_until=timezone.now() + timedelta(days=2))
    assert release().released == 0  # the relay knows the recipient is a cold contact: it holds it
    shown = body(alice, cold)
    assert shown["waitingReason"] == "cooling"
    assert abs((OutboxEntry.objects.get(message_id=cold).available_at - until).total_seconds()) < 1
    Contact.objects.create(instance=number, phone=alice.project.test_number, last_exchange_at=timezone.now(),
                           last_direction="inbound")
    [warm] = queue(alice, "UTILITY", 1)
    release()
    assert worker.send_one(warm) == "sent"
    assert not InstanceSignal.objects.filter(instance=number, kind="cold_send").exists()


def test_a_send_to_a_cold_contact_is_a_signal_for_the_governor(simulator, alice, number):
    open_on_simulator(simulator, number)
    [message_id] = queue(alice, "UTILITY", 1)
    release()
    assert worker.send_one(message_id) == "sent"
    assert list(InstanceSignal.objects.filter(instance=number).values_list("kind", "message_id")) == [
        ("cold_send", Message.objects.get(pk=message_id).pk)]


def test_an_otp_takes_the_numbers_next_slot_ahead_of_the_bulk_lanes(alice, number):
    marketing = queue(alice, "MARKETING", 3)
    [otp] = queue(alice, "OTP", 1)
    assert release("marketing").released == 0  # an OTP is due on this number: its slot is the OTP's
    assert release("otp").released == 1
    assert str(SendSchedule.objects.get(instance=number).reserved_by) == otp
    assert all(Message.objects.get(pk=i).dispatched_at is None for i in marketing)


def test_the_cold_quota_holds_cold_contacts_and_lets_known_ones_through(simulator, alice, number):
    open_on_simulator(simulator, number)
    now = timezone.now()
    SendSchedule.objects.create(instance=number, first_send_at=now, hour_started_at=now, hour_sent=10,
                                day_started_at=now, day_sent=10, day_cold=10)
    cold, late = queue(alice, "UTILITY", 2, to="+5511977776666")
    Message.objects.filter(pk=cold).update(deliver_until=now + timedelta(days=2))
    # The worker judges the recipient again at the claim (the relay released these before the quota filled).
    assert worker.send_one(cold) == "held"
    assert Message.objects.get(pk=cold).hold_reason.split("|")[0] == "warming_up"
    # The other one's deliverUntil comes before the number's next day, and no other number may reach the recipient:
    # FAILED NO_WARM_INSTANCE, naming the limit.
    assert worker.send_one(late) == "failed"
    late_message = Message.objects.get(pk=late)
    assert late_message.failure_reason == "NO_WARM_INSTANCE" and "warming_up" in late_message.failure_detail
    warm = queue(alice, "UTILITY", 1)[0]
    Contact.objects.create(instance=number, phone=alice.project.test_number, last_exchange_at=now,
                           last_direction="inbound")
    release()
    assert worker.send_one(warm) == "sent"


def test_a_claim_that_sends_nothing_frees_its_number(alice, number):
    # A TEST message to a magic number simulates its answer; a released message past its deadline fails at the claim:
    # neither keeps the number the relay reserved for it.
    from messaging import opt_ins
    from messaging.accept import SendRequest, accept_message

    opt_ins.record(alice.project, "+12015550100", "form", environment="TEST")
    magic = accept_message(alice.project, None, "TEST", SendRequest("+12015550100", "UTILITY", "hi"))["id"]
    assert release().released == 1
    assert str(SendSchedule.objects.get(instance=number).reserved_by) == magic
    assert worker.send_one(magic) == "sent"
    assert SendSchedule.objects.get(instance=number).reserved_by is None
    [late] = queue(alice, "UTILITY", 1)
    assert release().released == 1
    Message.objects.filter(pk=late).update(deliver_until=timezone.now())
    assert worker.send_one(late) == "expired"
    assert SendSchedule.objects.get(instance=number).reserved_by is None


def test_a_send_whose_turn_fails_to_end_still_frees_its_number(simulator, alice, number, monkeypatch):
    # given: a message the relay reserved the number for, and a turn's end that fails (a database error other than a
    # pool without a free connection: waiting_for_a_connection does not wait for it)
    from messaging.sending import slots

    open_on_simulator(simulator, number)
    [message_id] = queue(alice, "UTILITY", 1)
    assert release().released == 1

    def failing(*args, **kwargs):
        raise RuntimeError("the turn's end failed")

    monkeypatch.setattr(slots, "finish", failing)
    # when: the lane worker sends it; then: the error stands, the send went out, and the number is free for its next
    # message at once, not held until the claim's lease runs out
    with pytest.raises(RuntimeError):
        worker.send_one(message_id)
    assert len(sends_ok(simulator, number.name)) == 1
    assert SendSchedule.objects.get(instance=number).reserved_by is None


def out_of_cold_contacts(instance) -> None:
    """A new number that wrote to its first day's 10 cold contacts: its warm-up's cold quota is used up."""
    now = timezone.now()
    SendSchedule.objects.create(instance=instance, first_send_at=now, hour_started_at=now, hour_sent=10,
                                day_started_at=now, day_sent=10, day_cold=10)


def knows(instance, phone: str) -> None:
    Contact.objects.create(instance=instance, phone=phone, last_exchange_at=timezone.now(), last_direction="inbound")


def test_the_relay_holds_cold_contacts_at_the_cold_quota_naming_it_not_pacing(alice, number):
    out_of_cold_contacts(number)
    ids = queue(alice, "MARKETING", 3, to="+5511977776666")
    Message.objects.filter(pk__in=ids).update(deliver_until=timezone.now() + timedelta(days=3))
    assert release("marketing").released == 0  # none of them may go: the number is not reserved for one
    assert SendSchedule.objects.get(instance=number).reserved_by is None
    for message_id in ids:
        shown = body(alice, message_id)
        assert shown["waitingReason"] == "warming_up"
        assert [line["detail"]["why"] for line in shown["events"] if line["type"] == "WAITING"] == ["warming_up"]
        # Due when the number may write to a cold contact again (the end of its day), not a gap later.
        entry = OutboxEntry.objects.get(message_id=message_id)
        assert entry.available_at >= timezone.now() + timedelta(hours=23)


def test_a_message_the_cold_quota_held_expires_naming_the_cold_limit(alice, number):
    from messaging import reconciler

    out_of_cold_contacts(number)
    ids = queue(alice, "MARKETING", 2, to="+5511977776666")
    Message.objects.filter(pk__in=ids).update(deliver_until=timezone.now() + timedelta(days=3))
    release("marketing")
    # Time passes: their deadline comes before the number's cold quota frees up.
    Message.objects.filter(pk__in=ids).update(deliver_until=timezone.now())
    assert reconciler.expire_overdue() == 2
    for message_id in ids:
        shown = body(alice, message_id)
        assert (shown["status"], shown["failureReason"]) == ("FAILED", "EXPIRED")
        assert "warming_up" in shown["failureDetail"] and "pacing" not in shown["failureDetail"]


def test_a_cold_contact_the_quota_holds_past_its_deadline_fails_at_the_relay_naming_the_limit(alice, number):
    out_of_cold_contacts(number)
    [message_id] = queue(alice, "MARKETING", 1, to="+5511977776666")
    Message.objects.filter(pk=message_id).update(deliver_until=timezone.now() + timedelta(hours=2))
    assert release("marketing").released == 0
    shown = body(alice, message_id)
    # As the worker's claim says it: no number of the project may reach the recipient before its deliverUntil.
    assert (shown["status"], shown["failureReason"]) == ("FAILED", "NO_WARM_INSTANCE")
    assert "warming_up" in shown["failureDetail"] and "pacing" not in shown["failureDetail"]


def test_a_warm_message_does_not_wait_behind_a_cold_one_the_quota_holds(simulator, alice, number):
    open_on_simulator(simulator, number)
    out_of_cold_contacts(number)
    [cold] = queue(alice, "MARKETING", 1, to="+5511977776666")
    Message.objects.filter(pk=cold).update(deliver_until=timezone.now() + timedelta(days=3))
    [warm] = queue(alice, "MARKETING", 1)
    knows(number, alice.project.test_number)
    assert release("marketing").released == 1
    assert str(SendSchedule.objects.get(instance=number).reserved_by) == warm
    assert body(alice, cold)["waitingReason"] == "warming_up"
    assert worker.send_one(warm) == "sent"


def test_a_cold_contact_another_number_may_take_is_released_for_the_sticky_sender(simulator, alice, number):
    other = add_instance(alice.project, "alice-other", priority=20, profile="unofficial")
    open_on_simulator(simulator, number, other)
    out_of_cold_contacts(number)
    [cold] = queue(alice, "MARKETING", 1, to="+5511977776666")
    assert release("marketing").released == 1
    assert worker.send_one(cold) == "sent"
    assert Message.objects.get(pk=cold).instance == other


def test_a_number_no_relay_reserved_gets_its_schedule_at_its_first_send(alice, number):
    # given: a number without a schedule yet (the sticky sender's choice, which no relay reserved), and a claimed message
    import uuid

    from messaging.sending import slots

    [message_id] = queue(alice, "UTILITY", 1)
    message = Message.objects.get(pk=message_id)
    assert not SendSchedule.objects.filter(instance=number).exists()
    now = timezone.now()

    # when: the worker takes the number's turn
    begun = slots.begin(number.pk, message.pk, now, now + timedelta(minutes=1))

    # then: the schedule is made and held by this message, with the number's health as it stands
    assert begun is not None and begun.health_state == "healthy" and begun.schedule.day_sent == 0
    assert SendSchedule.objects.get(instance=number).reserved_by == message.pk
    # and another message finds the number held
    assert slots.begin(number.pk, uuid.uuid4(), now, now + timedelta(minutes=1)) is None


def test_a_numbers_turn_says_whether_the_recipient_is_a_cold_contact(alice, number):
    # given: a claimed message to a Brazilian mobile, and a number that has not exchanged with it yet
    import uuid

    from messaging import exchanges
    from messaging.sending import slots

    [message_id] = queue(alice, "UTILITY", 1, to="+5531999999999")
    now = timezone.now()
    until = now + timedelta(minutes=1)

    # when: the worker takes the number's turn, asking about the recipient; then: a cold contact, as is_cold says
    begun = slots.begin(number.pk, uuid.UUID(message_id), now, until, to="+5531999999999")
    assert begun is not None and begun.cold is True and sending_helpers.is_cold(number.pk, "+5531999999999")
    # and once the recipient wrote to the number from the jid without the ninth digit, no longer cold
    knows(number, "+553199999999")
    begun = slots.begin(number.pk, uuid.UUID(message_id), now, until, to="+5531999999999")
    assert begun is not None and begun.cold is False and not sending_helpers.is_cold(number.pk, "+5531999999999")
    # and a turn taken without a recipient does not ask
    assert slots.begin(number.pk, uuid.UUID(message_id), now, until).cold is None


def test_a_turn_that_ends_after_another_send_took_the_number_records_the_exchange_only(alice, number):
    # given: a number another send holds now (this message's lease ran out and the number was taken)
    import uuid

    from messaging.sending import policy, slots

    now = timezone.now()
    other = uuid.uuid4()
    SendSchedule.objects.create(instance=number, reserved_by=other, reserved_until=now + timedelta(minutes=1))

    # when: this message's turn ends after its send went out
    ended = slots.finish(number.pk, uuid.uuid4(), policy.Schedule(next_send_at=now, hour_sent=1, day_sent=1),
                         sent_to="+5511988887777", at=now)

    # then: its schedule is the other send's, untouched, and the number knows the recipient all the same
    assert ended is False
    schedule = SendSchedule.objects.get(instance=number)
    assert (schedule.reserved_by, schedule.day_sent, schedule.next_send_at) == (other, 0, None)
    contact = Contact.objects.get(instance=number, phone="+5511988887777")
    assert (contact.last_direction, contact.last_exchange_at) == ("outbound", now)
