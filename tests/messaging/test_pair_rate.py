"""An official number's pair rate (docs/sending-policy.md): one message every `pair_gap_seconds` (Meta: 6 s) to one
recipient, kept by the worker's pair slot (Redis, per process without it); other recipients do not wait."""

from __future__ import annotations

import random

import pytest

from messaging.models import Instance, Message
from messaging.sending import pacing, worker
from tests.conftest import add_instance
from tests.messaging.sending_helpers import events, open_on_simulator, queue, sends_ok


def test_a_pair_slot_is_kept_per_number_and_recipient():
    number = random.randint(10**6, 10**9)  # the slots live in Redis for their 6 s: a rerun meets none of them
    assert pacing.pair_slot(number, "+5511911110000", 6.0) == 0.0
    assert pacing.pair_slot(number, "+5511911110000", 6.0) < -5.5  # 6 s away: nothing reserved
    assert pacing.pair_slot(number, "+5511922220000", 6.0) == 0.0
    assert pacing.pair_slot(number + 1, "+5511911110000", 6.0) == 0.0


def test_without_redis_each_process_keeps_the_same_pair_slots(monkeypatch):
    monkeypatch.setattr(pacing, "_in_redis", lambda *args: None)
    pacing.reset_local()
    assert pacing.pair_slot(9_103, "+5511911110000", 6.0) == 0.0
    assert pacing.pair_slot(9_103, "+5511911110000", 6.0) < -5.5


@pytest.fixture
def cloud_number(alice):
    number = add_instance(alice.project, "alice-cloud", priority=1)
    Instance.objects.filter(pk=number.pk).update(send_policy={})  # Meta's pair rate, the default
    number.refresh_from_db()
    assert number.send_profile == "official"
    return number


def test_a_second_message_to_the_same_recipient_waits_for_the_pair_rate(simulator, alice, cloud_number):
    open_on_simulator(simulator, cloud_number)
    first, second = queue(alice, "UTILITY", 2)
    [other] = queue(alice, "UTILITY", 1, to="+5511966665555")
    assert worker.send_one(first) == "sent"
    assert worker.send_one(second) == "held"
    held = Message.objects.get(pk=second)
    assert (held.status, held.attempts) == ("QUEUED", 0)
    [line] = events(held, "WAITING")
    assert (line["why"], line["limit"]) == ("pacing", "pair rate")
    assert worker.send_one(other) == "sent"  # another recipient does not wait
    assert len(sends_ok(simulator, cloud_number.name)) == 2
