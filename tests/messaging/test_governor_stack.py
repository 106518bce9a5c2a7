"""The health governor on the real stack: the simulator's ban model answers a send to one cold contact too many
with 463 (an ERROR receipt through the webhook), the stack's ingestion records the strike, and the number stops
writing to cold contacts for a cooling period while it still writes to the ones it knows."""

from __future__ import annotations

import pytest
import requests

from messaging import opt_ins
from messaging.models import Instance, InstanceHealthEvent, Message
from tests.conftest import add_instance
from tests.messaging.sending_helpers import open_on_simulator
from tests.support.simulator import wait_until

pytestmark = pytest.mark.stack


def send(stack, alice, to: str) -> str:
    opt_ins.record(alice.project, to, "checkout")
    answer = requests.post(f"{stack.web_url}/v1/messages/send", headers={"Authorization": f"Bearer {alice.live_key}"},
                           json={"to": to, "category": "UTILITY", "text": "Your order shipped", "typing": "off"},
                           timeout=30)
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def test_a_463_on_a_cold_contact_starts_a_cooling_period(stack, simulator, alice):
    # given: a new unofficial number with no gap between sends, and a WhatsApp that allows it one cold contact
    number = add_instance(alice.project, "alice-phone", priority=10, profile="unofficial")
    Instance.objects.filter(pk=number.pk).update(send_policy={"gap_min_seconds": 0, "gap_max_seconds": 0})
    simulator.register(number, stack.webhook_url)
    open_on_simulator(simulator, number)
    simulator.ban_model(number.name, enabled=True, cold_max=1, warmup_start=1.0, min_gap_s=0,
                        strikes_to_disconnect=100)

    # when: it writes to two recipients it never talked with
    first = send(stack, alice, "+5511911110001")
    wait_until(lambda: Message.objects.get(pk=first).status in ("SENT", "SERVER_ACK", "DELIVERED", "READ"),
               timeout=30, message="the first send")
    second = send(stack, alice, "+5511911110002")

    # then: WhatsApp's 463 fails the second, and the number is at risk, cooling
    wait_until(lambda: Message.objects.get(pk=second).status == "FAILED", timeout=30, message="the 463")
    assert [s["wa_outcome"] for s in simulator.sends(instance=number.name)] == ["accepted", "463"]
    wait_until(lambda: Instance.objects.get(pk=number.pk).health_state == "at_risk", timeout=30,
               message="the governor's judgement")
    event = InstanceHealthEvent.objects.get(instance=number)
    assert (event.reason, event.actor, event.evidence["errors"]) == ("cold_contact_errors", "governor", 1)
    assert Instance.objects.get(pk=number.pk).cold_paused_until is not None

    # and: a third cold contact may not be written to before its deliverUntil (the cooling period lasts a day):
    # it fails NO_WARM_INSTANCE naming the cooling period, never sent; the first recipient still gets messages
    third = send(stack, alice, "+5511911110003")
    wait_until(lambda: Message.objects.get(pk=third).status == "FAILED", timeout=30, message="no warm instance")
    failed = Message.objects.get(pk=third)
    assert failed.failure_reason == "NO_WARM_INSTANCE" and "cooling" in failed.failure_detail
    again = send(stack, alice, "+5511911110001")
    wait_until(lambda: Message.objects.get(pk=again).status in ("SENT", "SERVER_ACK", "DELIVERED", "READ"),
               timeout=30, message="a send to a known contact")
    assert len(simulator.sends(instance=number.name)) == 3
