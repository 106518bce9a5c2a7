"""A heartbeat removed on a clean stop stays removed: a background beat under way when the process stops must not
write it back after the removal (the status page would show a stopped process as alive, then stale)."""

from __future__ import annotations

import threading
import time
from typing import Any
from unittest import mock

from pilot_status import heartbeats


def test_a_beat_under_way_when_the_process_stops_does_not_bring_its_heartbeat_back(db: Any) -> None:
    process = heartbeats.Process("beat")
    inside, go = threading.Event(), threading.Event()
    dumps = heartbeats.json.dumps

    def slow_dumps(value: Any) -> str:  # the beat has passed its stopped check and is about to write
        inside.set()
        go.wait(5)
        return dumps(value)

    with mock.patch.object(heartbeats.json, "dumps", slow_dumps):
        beating = threading.Thread(target=process.beat, kwargs={"force": True})
        beating.start()
        assert inside.wait(5)
        stopping = threading.Thread(target=process.forget)
        stopping.start()
        time.sleep(0.2)  # the stop runs (or waits) while the beat is under way
        go.set()
        beating.join(5)
        stopping.join(5)

    assert not any(beat["pid"] == process.pid and beat["process"] == "beat" for beat in heartbeats.processes())
    assert not heartbeats._redis().exists(process.key)
