"""Issue 26: a send that waits on Evolution must not hold a worker.

Real Evolution answers sendText only once WhatsApp took the message (0.3-3 s, more with a typing
delay). On the real stack, against a simulator instance that answers after 1 s, the lane's calls
overlap: many more are in flight at once than the lane has processes, counted at the simulator
(its max-in-flight gauge), so throughput is bounded by the instance's pacing, not by cores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import requests

from messaging import opt_ins
from messaging.models import Message
from tests.conftest import add_instance
from tests.support.processes import lane_worker_settings
from tests.support.simulator import wait_until

RECIPIENT = "+5511988887777"
MESSAGES = 40
SENT_OR_LATER = ("SENT", "SERVER_ACK", "DELIVERED", "READ")


def send_and_wait(stack, alice, count: int = MESSAGES, category: str = "UTILITY", instances: tuple[str, ...] = (),
                  **extra) -> None:
    """`count` sends through the API (named in turn to `instances`, if given), then until every one is SENT or later."""
    ids = []
    with requests.Session() as http:
        for n in range(count):
            if instances:
                extra["instance"] = instances[n % len(instances)]
            while True:
                response = http.post(
                    f"{stack.web_url}/v1/messages/send",
                    json={"to": RECIPIENT, "category": category, "text": f"Order {n} shipped", **extra},
                    headers={"Authorization": f"Bearer {alice.live_key}"},
                    timeout=10,
                )
                if response.status_code != 429:
                    break
                # Hundreds of sends from one key meet its rate limit: wait as a client is told to.
                time.sleep(float(response.headers.get("Retry-After") or 1))
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
    wait_until(
        lambda: Message.objects.filter(pk__in=ids, status__in=SENT_OR_LATER).count() == count,
        timeout=90, interval=0.5, message=f"all {count} SENT",
    )


@contextmanager
def lane_worker_env(stack, lane: str, **env: str) -> Iterator[None]:
    """That lane's worker restarted with `env` on top of the stack's, and restarted as it was afterwards."""
    saved = dict(stack.env)
    stack.env.update(env)
    stack.restart(f"worker-{lane}")
    try:
        yield
    finally:
        stack.env.clear()
        stack.env.update(saved)
        stack.restart(f"worker-{lane}")


def test_a_slow_gateway_gets_many_more_sends_in_flight_than_the_lane_has_processes(
    stack, simulator, alice, alice_instance
):
    simulator.register(alice_instance, stack.webhook_url)
    simulator.faults(alice_instance.name, latency_ms=1000)
    opt_ins.record(alice.project, RECIPIENT, "form")
    send_and_wait(stack, alice)
    counted = simulator.stats()["send_text"]
    assert counted["total"] == MESSAGES  # each once: nothing sent twice for the concurrency
    processes = 1  # the stack starts one Celery worker process per lane...
    prefork_children = 2  # ...which used to fork two children, one blocked HTTP call each
    assert counted["max_in_flight"] > max(processes, prefork_children) * 4, counted
    # The lane's pool is what bounds it: at most its concurrency in flight at once.
    assert counted["max_in_flight"] <= lane_worker_settings("utility").concurrency, counted


def test_a_gateway_whose_root_does_not_answer_still_gets_many_sends_in_flight(stack, simulator, alice):
    # Behind a proxy with a path prefix, or in another gateway version, `GET /` is not Evolution's welcome. Nothing
    # that decides when a number may send may depend on it: a lane worker that starts against such a gateway sends
    # each number's messages as fast as its policy allows (official numbers: their rate), many calls at once.
    numbers = [add_instance(alice.project, f"alice-cloud-{n}", priority=10 + n) for n in range(3)]
    for number in numbers:
        simulator.register(number, stack.webhook_url)
        simulator.faults(number.name, latency_ms=800)
    opt_ins.record(alice.project, RECIPIENT, "form")
    simulator.set_global(root_status=404)
    try:
        with lane_worker_env(stack, "utility"):  # a worker that meets this gateway from its start
            send_and_wait(stack, alice, count=60, instances=tuple(number.name for number in numbers))
    finally:
        simulator.set_global(root_status=200)
    counted = simulator.stats()["send_text"]
    assert counted["total"] == 60, counted
    assert counted["max_in_flight"] > 4, counted


def test_the_calls_in_flight_at_one_instance_are_bounded_by_its_pacing_not_by_threads(
    stack, simulator, alice, alice_instance, settings
):
    # At most rate × latency + burst at once, however many threads the lane has (issue 26).
    alice_instance.send_rate_per_second = 5
    alice_instance.save(update_fields=["send_rate_per_second"])
    simulator.register(alice_instance, stack.webhook_url)
    simulator.faults(alice_instance.name, latency_ms=1000)
    opt_ins.record(alice.project, RECIPIENT, "form")
    send_and_wait(stack, alice, typing="off")
    counted = simulator.stats()["send_text"]
    assert counted["total"] == MESSAGES
    bound = 5 * 1.0 + settings.SEND_RATE_BURST
    assert counted["max_in_flight"] <= bound + 1, counted  # one for a call whose answer is still on its way back
    assert counted["max_in_flight"] > 2, counted  # and the calls still overlap
