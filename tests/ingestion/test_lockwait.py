"""LockWaits on its own: when a kept delivery is looked at again, and that the tries are bounded."""

from __future__ import annotations

from ingestion.lockwait import LockWaits
from tests.ingestion.helpers import Clock


class Delivery:
    def __init__(self, tag: int) -> None:
        self.delivery_tag = tag


def test_a_kept_delivery_is_due_after_the_interval_and_kept_at_most_the_tries():
    clock = Clock()
    waits = LockWaits(tries=3, interval_s=0.1, clock=clock)
    one = Delivery(1)
    assert waits.keep(one) == 1 and len(waits) == 1
    assert waits.due() == []
    clock.now += 0.1
    assert waits.due() == [one]
    assert waits.due() == []  # popped once; still kept until done
    assert waits.keep(one) == 2 and waits.keep(one) == 3
    assert waits.keep(one) == 0  # the tries are used: the caller delays it
    waits.done(one)
    assert len(waits) == 0


def test_due_ones_come_in_the_order_they_started_waiting():
    clock = Clock()
    waits = LockWaits(tries=3, interval_s=0.1, clock=clock)
    one, two, three = Delivery(1), Delivery(2), Delivery(3)
    waits.keep(one)
    clock.now += 0.05
    waits.keep(two)
    waits.keep(three)
    clock.now += 0.06
    assert waits.due() == [one]
    clock.now += 0.05
    assert waits.due() == [two, three]


def test_take_all_hands_back_every_kept_delivery_and_forgets_them():
    waits = LockWaits(tries=3, interval_s=0.1, clock=Clock())
    one, two = Delivery(1), Delivery(2)
    waits.keep(one)
    waits.keep(two)
    assert waits.take_all() == [one, two]
    assert len(waits) == 0 and waits.due() == []
    assert waits.keep(one) == 1  # a new start after forgetting
