"""DeferredAcks on its own: when a batch is acked, and that it is one ack with `multiple`."""

from __future__ import annotations

from ingestion.acks import DeferredAcks
from tests.ingestion.helpers import Clock


class Delivery:
    def __init__(self, tag: int, log: list[tuple[int, bool]]) -> None:
        self.tag = self.delivery_tag = tag
        self.log = log

    def ack(self, multiple: bool = False) -> None:
        self.log.append((self.tag, multiple))


def test_a_full_batch_is_one_multiple_ack_of_its_newest_delivery():
    log: list[tuple[int, bool]] = []
    acks = DeferredAcks(batch=3, max_delay_s=1, clock=Clock())
    for tag in range(1, 8):
        acks.add(Delivery(tag, log))
    assert log == [(3, True), (6, True)]
    assert acks.pending == 1


def test_a_trickle_is_acked_once_its_oldest_waited_long_enough():
    log: list[tuple[int, bool]] = []
    clock = Clock()
    acks = DeferredAcks(batch=20, max_delay_s=0.1, clock=clock)
    acks.add(Delivery(1, log))
    clock.now += 0.05
    acks.add(Delivery(2, log))
    acks.flush_if_due()
    assert log == []
    clock.now += 0.06  # the first one has now waited 0.11 s
    acks.flush_if_due()
    assert log == [(2, True)]
    acks.flush_if_due()  # nothing pending: nothing sent
    assert log == [(2, True)]


def test_forgotten_deliveries_are_never_acked():
    log: list[tuple[int, bool]] = []
    acks = DeferredAcks(batch=20, max_delay_s=0, clock=Clock())
    acks.add(Delivery(1, log))
    acks.forget()  # their channel is gone
    acks.flush()
    acks.flush_if_due()
    assert log == []


def test_a_batch_of_one_acks_each_delivery_on_its_own_at_once():
    # CONSUMER_ACK_BATCH=1 (issue 25's switch): kombu's plain `message.ack()`, nothing left pending.
    log: list[tuple[int, bool]] = []
    acks = DeferredAcks(batch=1, max_delay_s=0.1, clock=Clock())
    for tag in range(1, 4):
        acks.add(Delivery(tag, log))
        assert log[-1] == (tag, False) and acks.pending == 0
    acks.flush_if_due()
    acks.flush()
    assert log == [(1, False), (2, False), (3, False)]


def test_a_held_delivery_is_never_acked_by_a_later_deliverys_multiple_ack():
    # 1 handled, 2 held (its lock taken elsewhere: looked at again shortly), 3 and 4 handled.
    log: list[tuple[int, bool]] = []
    clock = Clock()
    acks = DeferredAcks(batch=2, max_delay_s=0.1, clock=clock)
    d = {tag: Delivery(tag, log) for tag in range(1, 6)}
    acks.add(d[1])
    acks.hold(d[2])
    acks.add(d[3])
    acks.add(d[4])  # a full batch, but a `multiple` ack of 4 would ack 2
    clock.now += 1
    acks.flush_if_due()
    acks.flush()
    assert log == [(1, True)]  # only what is before the held one
    acks.add(d[2])  # its lock was done on the next look: 2, 3 and 4 join the batch, one ack
    assert log == [(1, True), (4, True)] and acks.pending == 0
    acks.add(d[5])  # batching as before
    assert acks.pending == 1


def test_held_deliveries_settle_in_any_order_and_handed_back_ones_need_no_ack():
    log: list[tuple[int, bool]] = []
    acks = DeferredAcks(batch=20, max_delay_s=0.1, clock=Clock())
    d = {tag: Delivery(tag, log) for tag in range(1, 7)}
    acks.hold(d[1])
    acks.add(d[2])
    acks.hold(d[3])
    acks.add(d[4])
    acks.add(d[3])  # the newer held one is done first: still behind 1
    acks.flush()
    assert log == [] and acks.pending == 0
    acks.drop(d[1])  # handed back (requeued): no longer unacked, so 2, 3 and 4 may go
    assert acks.pending == 3
    acks.flush()
    assert log == [(4, True)]
    acks.hold(d[5])
    acks.drop(d[5])  # nothing handled after it: nothing to ack
    acks.flush()
    assert log == [(4, True)] and not acks.held


def test_a_held_delivery_done_with_nothing_after_it_is_acked_itself():
    log: list[tuple[int, bool]] = []
    acks = DeferredAcks(batch=20, max_delay_s=0.1, clock=Clock())
    acks.hold(Delivery(1, log))
    acks.add(Delivery(1, log))
    acks.flush()
    assert log == [(1, True)]


def test_forgetting_the_channel_forgets_held_deliveries():
    log: list[tuple[int, bool]] = []
    acks = DeferredAcks(batch=20, max_delay_s=0, clock=Clock())
    acks.hold(Delivery(1, log))
    acks.add(Delivery(2, log))
    acks.forget()
    acks.add(Delivery(1, log))  # redelivered on the new channel with tag 1: an ordinary delivery
    acks.flush()
    assert log == [(1, True)] and not acks.held


def test_with_a_batch_of_one_a_held_delivery_changes_nothing():
    log: list[tuple[int, bool]] = []
    acks = DeferredAcks(batch=1, max_delay_s=0.1, clock=Clock())
    acks.hold(Delivery(1, log))
    acks.add(Delivery(2, log))
    acks.add(Delivery(1, log))
    assert log == [(2, False), (1, False)]
