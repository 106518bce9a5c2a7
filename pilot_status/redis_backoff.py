"""After Redis failed, a process leaves it alone for a few seconds and uses its own fallback meanwhile.

Redis is unreachable for seconds at a time (a restart, a failover): asking it again on every call
would add its connect timeout to every send, release and webhook. Each caller keeps its own fallback
(per-process breakers, buckets, a window that counts as closed); this is only the clock they share.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class RedisBackoff:
    def __init__(self, what: str, seconds: float = 5.0) -> None:
        self.what = what  # said in the warning: what runs without Redis meanwhile
        self.seconds = seconds
        self.until = 0.0

    def ready(self) -> bool:
        """Whether Redis may be asked now."""
        return time.monotonic() >= self.until

    def failed(self, exc: BaseException) -> None:
        self.until = time.monotonic() + self.seconds
        log.warning("%s: Redis unavailable (%s)", self.what, exc.__class__.__name__)

    def reset(self) -> None:
        """Ask Redis again at once (tests, and after a process's fallback state is reset)."""
        self.until = 0.0
