"""The adaptive limit's probe of Evolution (messaging.sending.gateway_probe): against the real simulator
over real HTTP, a round trip that leaves out this process's own wait for the GIL."""

from __future__ import annotations

import socket
import statistics
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import requests

from messaging.sending import gateway_limit, gateway_probe

pytestmark = pytest.mark.skipif(gateway_probe.SO_TIMESTAMPNS is None, reason="needs SO_TIMESTAMPNS (Linux)")


def test_the_probe_times_the_simulators_answer_by_the_kernels_clock(simulator: Any) -> None:
    assert gateway_probe.stamped(simulator.base_url)
    trip = gateway_probe.round_trip(simulator.base_url, 1.0, 2.0)
    assert trip is not None and 0 < trip < 2.0


def test_an_https_url_is_timed_by_the_caller() -> None:
    assert not gateway_probe.stamped("https://evolution.example.com")


def test_a_refused_port_or_an_answer_other_than_200_says_nothing_about_the_queue(simulator: Any) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert gateway_probe.round_trip(f"http://127.0.0.1:{port}", 1.0, 1.0) is None
    # A path prefix the simulator does not serve: its 404, not a round trip.
    assert requests.get(f"{simulator.base_url}/nothing/", timeout=5).status_code == 404
    assert gateway_probe.round_trip(f"{simulator.base_url}/nothing", 1.0, 2.0) is None


def test_a_gateway_that_never_answers_reads_as_the_timeout() -> None:
    with socket.socket() as silent:  # listens, so the connect completes, and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        assert gateway_probe.round_trip(url, 1.0, 0.2) == 0.2


SWITCH_INTERVAL = 0.05


@contextmanager
def gil_held_by_busy_threads() -> Iterator[None]:
    """Three threads that spin in Python, and a 50-ms switch interval: a thread whose socket call returns
    waits about that long for the GIL, as a lane worker's probe waits among its hundreds of threads."""
    interval, stop = sys.getswitchinterval(), threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(3)]
    sys.setswitchinterval(SWITCH_INTERVAL)
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        for spinner in spinners:
            spinner.join()


def test_the_probe_leaves_out_this_processs_wait_for_the_gil(simulator: Any) -> None:
    # Timed in Python, each of these read several switch intervals (every socket call's return waited for
    # the GIL): the limit would have cut the lane for a queue the gateway did not have.
    session = requests.Session()
    session.trust_env = False
    gateway_limit.probe_once(session)  # connected and warm, as a running lane's probe is
    with gil_held_by_busy_threads():
        trips = [gateway_limit.probe_once(session) for _ in range(5)]
    assert None not in trips
    assert statistics.median(t for t in trips if t is not None) < SWITCH_INTERVAL / 2
