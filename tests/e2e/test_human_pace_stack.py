"""An unofficial number on the real stack (docs/sending-policy.md): one sendText in flight at a time, typing then
sending inside its slot, and a jittered gap between sends; the simulator's ban model, judging the same compressed
time, finds nothing to hold against the number."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import requests

from messaging import opt_ins
from messaging.models import Message
from tests.conftest import add_instance
from tests.support.simulator import wait_until

SCALE = 10  # policy (and ban model) seconds per real second: the 5-30 s gaps last 0.5-3 s
COUNT = 8
SENT_OR_LATER = ("SENT", "SERVER_ACK", "DELIVERED", "READ")


@contextmanager
def policy_time_scale(stack, scale: float) -> Iterator[None]:
    """The relay and the utility lane's worker restarted with SENDING_POLICY_TIME_SCALE and typing on (the tests'
    environment turns it off), and as they were after."""
    saved = dict(stack.env)
    stack.env.update(SENDING_POLICY_TIME_SCALE=str(scale), TYPING_DELAY_MS_PER_CHAR="30")
    for name in ("relay", "worker-utility"):
        stack.restart(name)
    try:
        yield
    finally:
        stack.env.clear()
        stack.env.update(saved)
        for name in ("relay", "worker-utility"):
            stack.restart(name)


def test_one_unofficial_number_sends_one_at_a_time_with_jittered_gaps(stack, simulator, alice):
    number = add_instance(alice.project, "alice-phone", priority=1, profile="unofficial")
    simulator.register(number, stack.webhook_url)
    simulator.faults(number.name, latency_ms=300)
    simulator.time_scale(SCALE)
    simulator.ban_model(number.name, enabled=True)
    recipients = [f"+55119777{n:05d}" for n in range(COUNT)]
    for phone in recipients:
        opt_ins.record(alice.project, phone, "form")
    with policy_time_scale(stack, SCALE):
        ids = []
        with requests.Session() as http:
            for n, phone in enumerate(recipients):
                response = http.post(f"{stack.web_url}/v1/messages/send", timeout=10,
                                     json={"to": phone, "category": "UTILITY", "text": f"Your order {n} shipped"},
                                     headers={"Authorization": f"Bearer {alice.live_key}"})
                assert response.status_code == 202, response.text
                ids.append(response.json()["id"])
        wait_until(lambda: Message.objects.filter(pk__in=ids, status__in=SENT_OR_LATER).count() == COUNT,
                   timeout=120, interval=0.5, message=f"all {COUNT} SENT")
    sends = sorted((s for s in simulator.sends(instance=number.name) if s.get("id")), key=lambda s: s["at"])
    assert len(sends) == COUNT
    # Each call (typing, then the text: Evolution's `delay`) ended before the next began ...
    ends = [s["at"] + s["served_ms"] / 1000 for s in sends]
    gaps = [after["at"] - end for end, after in zip(ends, sends[1:])]
    assert min(gaps) >= 5 / SCALE - 0.05, gaps
    assert all(s.get("delay") for s in sends), sends[0]  # "typing…" was shown inside each slot
    # ... and the gaps are drawn, not fixed.
    assert max(gaps) - min(gaps) > 0.2, gaps
    standing = simulator.standing(number.name)
    assert standing["max_in_flight"] == 1, standing
    assert standing["strikes"] == 0 and not standing["banned"], standing
