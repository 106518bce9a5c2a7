"""Acks in batches: one `basic.ack` with `multiple` for up to N handled deliveries.

A quorum queue settles every ack through its Raft log; acking twenty handled deliveries at once
cuts RabbitMQ's CPU per consumed message (bench/findings.md, "Batched consumer ACKs"). An ack is only
deferred for a delivery whose work is done (its row committed, its copy confirmed in a delay
queue, or the other channel's done mark seen), so a crash before the flush makes the broker
redeliver those deliveries and the done mark or the inbox skips them: a duplicate, never a loss.

Deliveries on one channel are handled in order, so acking the newest handled one with `multiple`
acks exactly the handled ones before it (a requeued delivery is no longer unacked).

A delivery kept unacked to be looked at again (`hold`, lockwait.py) must not be acked by that
`multiple`: the ack then goes on the newest handled delivery before the oldest one held. Handled
deliveries after a held one wait behind it, and join the batch when it is done (`add`) or handed back
(`drop`), so it costs no ack of its own.

A batch of 1 (CONSUMER_ACK_BATCH=1) is kombu's plain way: each delivery acked on its own, at once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Held:
    message: Any
    settled: bool = False  # done (ack-able) or handed back
    acked_by: Any = None  # the newest handled delivery after it (and before the next held one)
    pending: int = 0  # handled deliveries it stands for in the batch once it is settled
    since: float = 0.0  # when the first of them was handled


class DeferredAcks:
    def __init__(self, batch: int, max_delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.batch = batch
        self.max_delay_s = max_delay_s
        self.clock = clock
        self.newest: Any = None  # the newest handled delivery not acked yet
        self.pending = 0
        self.oldest_at = 0.0
        self.held: deque[_Held] = deque()  # in delivery order
        self.held_by_tag: dict[Any, _Held] = {}

    def add(self, message: Any) -> None:
        """The delivery's work is done: ack it (with the batch)."""
        if self.batch <= 1:
            message.ack()
            return
        if self.held:
            self._add_behind(message)
            return
        if self.newest is None:
            self.oldest_at = self.clock()
        self.newest = message
        self.pending += 1
        if self.pending >= self.batch:
            self.flush()

    def hold(self, message: Any) -> None:
        """Keep `message` unacked until `add` (done) or `drop` (handed back) settles it."""
        if self.batch > 1 and message.delivery_tag not in self.held_by_tag:
            self.held_by_tag[message.delivery_tag] = held = _Held(message)
            self.held.append(held)

    def drop(self, message: Any) -> None:
        """A held delivery was handed back (requeued): it is no longer unacked, nothing acks it."""
        held = self.held_by_tag.get(message.delivery_tag)
        if held is not None:
            held.settled = True
            self._release()

    def _add_behind(self, message: Any) -> None:
        held = self.held_by_tag.get(message.delivery_tag)
        if held is not None:  # a held delivery is done: it acks like a handled one in its place
            held.settled = True
            self._count(held, message)
            self._release()
        else:  # newer than every held one (deliveries are handled in order)
            self._count(self.held[-1], message)

    def _count(self, held: _Held, message: Any) -> None:
        if held.acked_by is None:
            held.since = self.clock()
            held.acked_by = message
        elif message.delivery_tag > held.acked_by.delivery_tag:
            held.acked_by = message
        held.pending += 1

    def _release(self) -> None:
        # The oldest held ones that are settled join the batch: nothing before the next held one
        # stays unacked, so a `multiple` ack on their newest handled delivery is safe again.
        while self.held and self.held[0].settled:
            held = self.held.popleft()
            del self.held_by_tag[held.message.delivery_tag]
            if held.acked_by is None:
                continue
            if self.newest is None:
                self.oldest_at = held.since
            self.newest = held.acked_by
            self.pending += held.pending
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
        self.newest = None
        self.pending = 0
        newest.ack(multiple=True)

    def forget(self) -> None:
        """The channel is gone: the broker redelivers what was not acked on it."""
        self.newest = None
        self.pending = 0
        self.held.clear()
        self.held_by_tag.clear()
