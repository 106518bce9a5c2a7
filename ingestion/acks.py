"""Acks in batches: one `basic.ack` with `multiple` for up to N handled deliveries.

A quorum queue settles every ack through its Raft log; acking twenty handled deliveries at once
cuts RabbitMQ's CPU per consumed message (bench/findings.md, "Batched consumer ACKs"). An ack is only
deferred for a delivery whose work is done (its row committed, its copy confirmed in a delay
queue, or the other channel's done mark seen), so a crash before the flush makes the broker
redeliver those deliveries and the done mark or the inbox skips them: a duplicate, never a loss.

Deliveries on one channel are handled in order, so acking the newest handled one with `multiple`
acks exactly the handled ones before it (a requeued delivery is no longer unacked).

A batch of 1 (CONSUMER_ACK_BATCH=1) is kombu's plain way: each delivery acked on its own, at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class DeferredAcks:
    def __init__(self, batch: int, max_delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.batch = batch
        self.max_delay_s = max_delay_s
        self.clock = clock
        self.newest: Any = None  # the newest handled delivery not acked yet
        self.pending = 0
        self.oldest_at = 0.0

    def add(self, message: Any) -> None:
        if self.batch <= 1:
            message.ack()
            return
        if self.newest is None:
            self.oldest_at = self.clock()
        self.newest = message
        self.pending += 1
        if self.pending >= self.batch:
            self.flush()

    def flush_if_due(self) -> None:
        """Ack what waited long enough: a trickle of events is acked within about max_delay_s."""
        if self.newest is not None and self.clock() - self.oldest_at >= self.max_delay_s:
            self.flush()

    def flush(self) -> None:
        if self.newest is None:
            return
        newest = self.newest
        self.forget()
        newest.ack(multiple=True)

    def forget(self) -> None:
        """The channel is gone: the broker redelivers what was not acked on it."""
        self.newest = None
        self.pending = 0
