"""Deliveries whose event lock the other channel holds, kept unacked and looked at again shortly.

Evolution sends each event by webhook and by RabbitMQ at about the same time, so the consumer often
finds the event's lock (locks.py) held by the webhook, which is processing that very event and gives
it back within milliseconds, usually as the done mark. Looked at again a tenth of a second later, the
copy is then acked without a database statement (or handled, if the lock is free). Moving it to the
5 s delay queue instead costs a confirmed publish, two more quorum-queue enqueues and acks, and 5 s;
only a lock still held after the last look sends it there.

A kept delivery stays unacked (acks.py `hold`), so the broker redelivers it if the channel goes; the
prefetch bounds how many are kept, and the tries bound how long.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any


class LockWaits:
    def __init__(self, tries: int, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.tries = tries
        self.interval_s = interval_s
        self.clock = clock
        self.looks: dict[Any, int] = {}  # delivery tag → waits so far, for every kept delivery
        self.queue: deque[tuple[float, Any]] = deque()  # (due, delivery), due in order: one interval

    def __len__(self) -> int:
        return len(self.looks)

    def keep(self, message: Any) -> int:
        """Keep `message` for another look: which wait this is (1 = the first), 0 once the tries are used."""
        waited = self.looks.get(message.delivery_tag, 0)
        if waited >= self.tries:
            return 0
        self.looks[message.delivery_tag] = waited + 1
        self.queue.append((self.clock() + self.interval_s, message))
        return waited + 1

    def due(self) -> list[Any]:
        """The kept deliveries to look at again now (still kept until `done`)."""
        now = self.clock()
        found = []
        while self.queue and self.queue[0][0] <= now:
            found.append(self.queue.popleft()[1])
        return found

    def done(self, message: Any) -> None:
        """`message` is settled (acked, delayed, parked or handed back): forget its waits."""
        if self.looks:
            self.looks.pop(message.delivery_tag, None)

    def take_all(self) -> list[Any]:
        """Every kept delivery not yet due again (to hand back), forgotten here."""
        found = [message for _, message in self.queue]
        self.forget()
        return found

    def forget(self) -> None:
        """The channel is gone: the broker redelivers the kept deliveries."""
        self.looks.clear()
        self.queue.clear()
