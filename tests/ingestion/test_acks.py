"""DeferredAcks on its own: when a batch is acked, and that it is one ack with `multiple`."""

from __future__ import annotations

from ingestion.acks import DeferredAcks


class Delivery:
    def __init__(self, tag: int, log: list[tuple[int, bool]]) -> None:
        self.tag = tag
        self.log = log

    def ack(self, multiple: bool = False) -> None:
        self.log.append((self.tag, multiple))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


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
