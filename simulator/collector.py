"""Keeps CPython's full garbage collections from stopping the simulator's answers.

A full (generation 2) collection walks every object the collector tracks, with the event loop stopped. Under a
receipt storm the simulator holds thousands of pending deliveries, and on a loaded two-core host each full collection
stopped it for 100-660 ms, every few seconds: bench B3 read those stops as the gateway's time to answer an OTP
(bench/findings.md, "The simulator's garbage collector"). Evolution runs on V8, whose old generation is marked
incrementally, without stops that long, so the simulator should not invent them. It:
- freezes what exists once it serves (modules, the app, preloaded instances) out of every collection (`gc.freeze`);
- leaves the young generations' collections as they are: they free the short-lived cycles of requests;
- runs full collections itself: at every reset (`/_control/reset`, when no answer is waited for) and otherwise once
  FULL_EVERY_S have passed since the last one, so that a long `make run` never keeps cyclic garbage for more than
  that, while a test or a benchmark that resets more often never meets one in the middle of its traffic.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass

FULL_EVERY_S = 600.0
# A count of young collections no run reaches: the automatic full collection never comes.
_NEVER = 2**31 - 1


@dataclass
class Collections:
    full: int = 0  # full collections run by the simulator
    last_full_ms: float = 0.0  # how long the last one stopped the simulator
    last_full_at: float = 0.0  # when it ran (time.monotonic())


COLLECTIONS = Collections()


def settle() -> None:
    """Once serving: collect, freeze what is left, and turn the automatic full collections off."""
    full()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)


def full() -> None:
    """A full collection of everything, frozen objects too, then what survives is frozen again."""
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    COLLECTIONS.full += 1
    COLLECTIONS.last_full_ms = (time.perf_counter() - started) * 1000
    COLLECTIONS.last_full_at = time.monotonic()


def due_in(seconds: float = FULL_EVERY_S) -> float:
    """Seconds until a full collection is due: `seconds` after the last one, whatever ran it."""
    return COLLECTIONS.last_full_at + seconds - time.monotonic()


async def collect_every(seconds: float = FULL_EVERY_S) -> None:
    while True:
        wait = due_in(seconds)
        if wait > 0:
            await asyncio.sleep(wait)
        else:
            full()


def describe() -> dict[str, object]:
    return {"frozen": gc.get_freeze_count(), "threshold": list(gc.get_threshold()), "full": COLLECTIONS.full,
            "last_full_ms": round(COLLECTIONS.last_full_ms, 1)}
