"""A process's threads share a bounded pool of Redis connections and wait for a free one.

A lane worker runs 384 threads. redis-py's own pool refuses a command once 100 connections are busy
("Too many connections"), and each caller then takes Redis for unavailable: the send path fell back to
per-process pacing buckets and circuit state in a burst while Redis was up (bench B2's worker logs).
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings

from pilot_status.metrics import redis

BURST = 384  # threads: a bulk lane worker's, almost four times redis-py's default pool


def test_a_burst_of_threads_beyond_the_pool_all_get_their_answers() -> None:
    first = int(redis().get("ps:test:redis-pool") or 0)
    start = threading.Barrier(BURST)
    failures: list[BaseException] = []
    answers: list[Any] = []

    def one() -> None:
        start.wait()
        try:
            # A thread holds its connection until it has read the answer, which waits for the GIL here.
            answers.append(redis().incr("ps:test:redis-pool"))
        except Exception as exc:  # noqa: BLE001 (each failure is the finding)
            failures.append(exc)

    threads = [threading.Thread(target=one) for _ in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    assert sorted(answers) == list(range(first + 1, first + BURST + 1))


def test_the_pool_is_bounded() -> None:
    pool = redis().connection_pool
    assert pool.max_connections == settings.REDIS_MAX_CONNECTIONS < 100


def test_the_threads_of_a_process_share_one_client() -> None:
    # Django's caches are per thread; a client per thread cost a lane worker about 20 KB a thread.
    clients: list[Any] = []
    threads = [threading.Thread(target=lambda: clients.append(redis())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(client is redis() for client in clients)


def test_a_test_that_moves_the_cache_gets_a_client_for_it(settings: Any) -> None:
    before = redis()
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}}
    assert redis() is not before
    assert redis().connection_pool.connection_kwargs["port"] == 1
