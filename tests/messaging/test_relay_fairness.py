"""The relay's release policy on real Postgres and RabbitMQ: shallow lanes, round-robin by
project, per-instance pace, OTP independent of marketing (dispatch.release_due)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from django.utils import timezone

from messaging import dispatch
from messaging.accept import SendRequest, accept_message
from messaging.models import Environment, Message, OutboxEntry
from pilot_status.celery import app
from tests.conftest import add_instance
from tests.messaging.sending_helpers import queue


def released_projects(ids: set[str]) -> Counter:
    return Counter(Message.objects.filter(pk__in=ids).values_list("project__name", flat=True))


def dispatched_ids() -> set[str]:
    return {str(pk) for pk in Message.objects.filter(dispatched_at__isnull=False).values_list("pk", flat=True)}


def test_a_blast_does_not_bury_another_projects_marketing(empty_lanes, fast_instances, settings, alice, carol):
    settings.RELAY_LANE_DEPTH = 20
    add_instance(alice.project, "alice-main")
    add_instance(carol.project, "carol-main")
    queue(alice, "MARKETING", 200)
    queue(carol, "MARKETING", 5)

    result = dispatch.release_due()

    assert result.released == 20 and result.held
    assert released_projects(dispatched_ids()) == {"Carol Bank": 5, "Alice Store": 15}


def test_a_blast_spread_over_many_instances_does_not_starve_another_project(
    empty_lanes, fast_instances, settings, alice, carol
):
    # given: alice's blast goes through 30 instances, carol's few messages through one
    settings.RELAY_LANE_DEPTH = 8
    names = [f"alice-{n}" for n in range(30)]
    for name in names:
        add_instance(alice.project, name)
    add_instance(carol.project, "carol-main")
    from messaging import opt_ins

    opt_ins.record(alice.project, alice.project.test_number, "form")
    for i in range(300):
        accept_message(
            alice.project, None, Environment.LIVE,
            SendRequest(alice.project.test_number, "MARKETING", f"hi {i}", instance=names[i % 30]),
        )
    queue(carol, "MARKETING", 5)

    # when: one pass with only a few free slots
    dispatch.release_due()

    # then: carol takes turns with alice instead of waiting behind all 30 of alice's instances
    assert released_projects(dispatched_ids())["Carol Bank"] >= 1


def test_each_lane_queue_stays_shallow(empty_lanes, fast_instances, settings, alice):
    settings.RELAY_LANE_DEPTH = 10
    add_instance(alice.project, "alice-main")
    queue(alice, "MARKETING", 25)

    assert dispatch.release_all_due().released == 10
    # A release returns once the broker has confirmed its tasks: the count is exact at once.
    assert dispatch.lane_depths(("marketing",))["marketing"] == 10
    assert dispatch.release_all_due().released == 0  # nobody consumed: the lane is full
    assert OutboxEntry.objects.filter(lane="marketing").count() == 15


def test_an_otp_is_released_while_the_marketing_lane_is_full(empty_lanes, fast_instances, settings, alice):
    settings.RELAY_LANE_DEPTH = 5
    add_instance(alice.project, "alice-main")
    queue(alice, "MARKETING", 30)
    dispatch.release_all_due()
    assert dispatch.lane_depths(("marketing",))["marketing"] == 5
    otp = queue(alice, "OTP", 1)

    assert dispatch.release_all_due().released == 1
    assert otp[0] in dispatched_ids()


def test_an_instance_is_released_at_its_pace(empty_lanes, settings, alice):
    settings.SEND_RATE_PER_INSTANCE = 2.0
    settings.SEND_RATE_BURST = 10
    add_instance(alice.project, "alice-main")
    queue(alice, "UTILITY", 30)

    first = dispatch.release_all_due()
    assert first.released == 4 and first.held  # burst: two seconds of its pace
    assert dispatch.release_all_due().released == 0


def test_an_instance_pace_can_be_set_per_instance(empty_lanes, fast_instances, alice):
    slow = add_instance(alice.project, "alice-main")
    slow.send_rate_per_second = 1.0
    slow.save()
    queue(alice, "UTILITY", 10)
    assert dispatch.release_all_due().released == 2


def test_the_relay_paces_a_number_at_the_rate_its_policy_decides(empty_lanes, fast_instances, alice):
    # sendPolicy's rate_per_second wins over the older send_rate_per_second column (sending.policy.rate)
    number = add_instance(alice.project, "alice-main")
    number.send_policy = {**number.send_policy, "rate_per_second": 1.0}
    number.send_rate_per_second = 50.0
    number.save()
    queue(alice, "UTILITY", 10)
    assert dispatch.release_all_due().released == 2  # its burst: two seconds of one send a second


def test_a_row_released_early_becomes_claimable_at_once(empty_lanes, fast_instances, alice):
    from messaging.sending import worker

    add_instance(alice.project, "alice-main")
    [message_id] = queue(alice, "UTILITY", 1)
    later = timezone.now() + timedelta(minutes=5)
    Message.objects.filter(pk=message_id).update(next_attempt_at=later)
    OutboxEntry.objects.filter(message_id=message_id).update(available_at=timezone.now())  # a reconnect

    assert dispatch.release_all_due().released == 1
    assert Message.objects.get(pk=message_id).next_attempt_at <= timezone.now()
    assert worker.claim(message_id) is not None


def test_with_one_free_slot_per_pass_projects_take_turns(empty_lanes, fast_instances, settings, alice, carol):
    # given: alice's older blast and carol's later few, and a lane with room for one task per pass
    settings.RELAY_LANE_DEPTH = 1
    add_instance(alice.project, "alice-main")
    add_instance(carol.project, "carol-main")
    queue(alice, "MARKETING", 50)
    queue(carol, "MARKETING", 5)

    # when: four passes, the worker taking the one task between them
    order = []
    for _ in range(4):
        before = dispatched_ids()
        assert dispatch.release_due().released == 1
        [released] = dispatched_ids() - before
        order.append(Message.objects.get(pk=released).project.name)
        assert dispatch.lane_depths(("marketing",))["marketing"] == 1
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge("marketing")

    # then: the project served least recently goes first, not the one with the oldest rows
    assert order == ["Alice Store", "Carol Bank", "Alice Store", "Carol Bank"]


def test_a_relay_for_some_lanes_leaves_the_others_alone(empty_lanes, fast_instances, alice):
    add_instance(alice.project, "alice-main")
    otp = queue(alice, "OTP", 2)
    marketing = queue(alice, "MARKETING", 3)

    assert dispatch.release_all_due(lanes=("otp",)).released == 2
    assert dispatch.next_due_at(("otp",)) is None  # nothing left for the OTP relay to wake for
    assert dispatch_ids_of(otp) == set(otp) and not dispatch_ids_of(marketing)


def dispatch_ids_of(ids: list[str]) -> set[str]:
    return dispatched_ids() & set(ids)


def counted_passes(monkeypatch) -> list[int]:
    """One item per relay pass (`dispatch.release_due` call) from now on."""
    passes: list[int] = []
    real = dispatch.release_due
    monkeypatch.setattr(dispatch, "release_due", lambda *a, **k: passes.append(1) or real(*a, **k))
    return passes


def test_a_wake_that_releases_everything_due_makes_one_pass(empty_lanes, fast_instances, alice, monkeypatch):
    # An OTP at a time wakes the relay once each: a second pass after one that took every due row would only
    # read the lane depths and the turns again to find nothing (bench P3: a relay pass per OTP).
    add_instance(alice.project, "alice-main")
    queue(alice, "OTP", 1)
    passes = counted_passes(monkeypatch)

    assert dispatch.release_all_due(lanes=("otp",)).released == 1
    assert len(passes) == 1


def test_a_pass_that_filled_its_slots_is_followed_by_another(empty_lanes, fast_instances, alice, monkeypatch):
    # Exactly as many due rows as slots: the pass cannot tell whether more were due, so it looks again.
    add_instance(alice.project, "alice-main")
    queue(alice, "UTILITY", 3)
    passes = counted_passes(monkeypatch)

    assert dispatch.release_all_due(limit=3, lanes=("utility",)).released == 3
    assert len(passes) == 2


def test_an_otp_is_released_on_a_number_whose_pace_marketing_used_up(empty_lanes, settings, alice):
    # given: a number at 2 sends/s whose burst the marketing backlog took
    settings.SEND_RATE_PER_INSTANCE = 2.0
    settings.SEND_RATE_BURST = 10
    add_instance(alice.project, "alice-main")
    queue(alice, "MARKETING", 30)
    assert dispatch.release_all_due(lanes=("marketing",)).released == 4
    assert dispatch.release_all_due(lanes=("marketing",)).released == 0  # paced: no token left

    # when: an OTP through the same number is due, its relay releases it now, borrowing from the number's future
    otp = queue(alice, "OTP", 1)
    assert dispatch.release_all_due(lanes=("otp",)).released == 1
    assert otp[0] in dispatched_ids()
    # and marketing repays it: still nothing for it
    assert dispatch.release_all_due(lanes=("marketing",)).released == 0


def test_the_otp_lane_keeps_its_own_shallower_depth(empty_lanes, fast_instances, settings, alice, carol):
    # given: alice's bulk of OTPs, a shallow OTP lane and a deep marketing one
    settings.RELAY_LANE_DEPTH_OTP = 4
    settings.RELAY_LANE_DEPTH = 50
    add_instance(alice.project, "alice-main")
    add_instance(carol.project, "carol-main")
    queue(alice, "OTP", 30)
    queue(alice, "MARKETING", 30)

    assert dispatch.release_all_due().released == 4 + 30
    assert dispatch.lane_depths(("otp", "marketing")) == {"otp": 4, "marketing": 30}

    # when: carol's OTP arrives and the OTP worker takes two tasks
    [carols] = queue(carol, "OTP", 1)
    with app.connection_for_write() as conn:
        for _ in range(2):
            conn.default_channel.basic_get("otp", no_ack=True)
    assert dispatch.release_all_due(lanes=("otp",)).released == 2

    # then: carol's OTP was released at once, behind at most the lane's depth of alice's
    assert carols in dispatched_ids()
