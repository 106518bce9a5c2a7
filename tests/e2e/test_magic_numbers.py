"""TEST magic numbers on real parts (issue 23 §4): a TEST key's send to each documented number ends as the
real outcome would (statuses, timeline, dead letter) through the same relay and lane worker, and
Evolution (the simulator) is never called; a LIVE send to the same number goes to Evolution."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from messaging import opt_ins, test_numbers
from messaging.models import DeadLetter, Message
from messaging.sending import breaker
from tests.support.simulator import wait_until

DELIVERED, READ, NOT_ON_WHATSAPP, INSTANCE_NOT_FOUND, FLAKY, EXPIRED = (
    "+12015550100", "+12015550101", "+12015550102", "+12015550103", "+12015550104", "+12015550105",
)


def send(stack, key: str, to: str, **extra) -> requests.Response:
    return requests.post(f"{stack.web_url}/v1/messages/send", headers={"Authorization": f"Bearer {key}"},
                         json={"to": to, "category": "UTILITY", "text": "Test {{n}}", "variables": {"n": "1"}, **extra},
                         timeout=30)  # a cold web worker on a loaded host takes seconds to answer its first request


def finished(message_id: str, status: str, timeout: float = 20) -> Message:
    return wait_until(lambda: Message.objects.filter(pk=message_id, status=status).first(), timeout=timeout,
                      message=status)


def kinds(message: Message) -> list[str]:
    return list(message.events.order_by("created_at", "pk").values_list("kind", flat=True))


def statuses(message: Message) -> list[str]:
    return [e.detail["status"] for e in message.events.filter(kind="STATUS").order_by("created_at", "pk")]


@pytest.fixture
def magic(stack, simulator, alice, alice_instance):
    simulator.register(alice_instance, stack.webhook_url)
    for number in test_numbers.NUMBERS:  # a consent in each world: the TEST key's sends and the LIVE key's
        opt_ins.record(alice.project, number, "integration tests", environment="TEST")
        opt_ins.record(alice.project, number, "integration tests", environment="LIVE")
    return alice


def untouched(simulator, alice_instance) -> None:
    assert simulator.sends(instance=alice_instance.name) == []
    assert not breaker.is_open(breaker.instance_scope(alice_instance.name))


def test_delivered_and_read_go_through_every_status_without_evolution(magic, stack, simulator, alice_instance):
    delivered = send(stack, magic.test_key, DELIVERED)
    read = send(stack, magic.test_key, READ)
    assert delivered.status_code == 202 and read.status_code == 202, (delivered.text, read.text)

    one = finished(delivered.json()["id"], "DELIVERED")
    two = finished(read.json()["id"], "READ")

    assert statuses(one) == ["SENT", "SERVER_ACK", "DELIVERED"]
    assert statuses(two) == ["SENT", "SERVER_ACK", "DELIVERED", "READ"]
    assert kinds(two)[:4] == ["ACCEPTED", "DISPATCHED", "ATTEMPT", "STATUS"]
    assert two.evolution_message_id.startswith("3EB0") and two.attempts == 1
    assert two.sent_at and two.server_ack_at and two.delivered_at and two.read_at
    untouched(simulator, alice_instance)


@pytest.mark.parametrize("number, reason", [(NOT_ON_WHATSAPP, "INVALID_RECIPIENT"),
                                            (INSTANCE_NOT_FOUND, "INSTANCE_NOT_FOUND")])
def test_permanent_failures_fail_with_a_dead_letter(magic, stack, simulator, alice_instance, number, reason):
    answer = send(stack, magic.test_key, number)
    assert answer.status_code == 202, answer.text

    message = finished(answer.json()["id"], "FAILED")

    assert message.failure_reason == reason and message.attempts == 1
    entry = DeadLetter.objects.get(message=message)
    assert entry.reason == reason and entry.status == "OPEN"
    # (The relay's DISPATCHED line is stamped when its pass commits, after the tasks are confirmed: a
    # simulated answer, which takes no time, can be back before that.)
    assert [kind for kind in kinds(message) if kind != "DISPATCHED"][-3:] == ["ATTEMPT", "FAILED", "DEAD_LETTERED"]
    attempt = message.events.get(kind="ATTEMPT").detail
    assert attempt["outcome"] == "permanent" and attempt["httpStatus"] in (400, 404)
    assert "simulated" in attempt["detail"]
    untouched(simulator, alice_instance)


def test_transient_failures_then_delivered(magic, stack, simulator, alice_instance):
    answer = send(stack, magic.test_key, FLAKY)

    message = finished(answer.json()["id"], "DELIVERED", timeout=60)

    assert message.attempts == 3
    attempts = [e.detail for e in message.events.filter(kind="ATTEMPT").order_by("created_at", "pk")]
    assert [a["outcome"] for a in attempts] == ["transient", "transient", "sent"]
    assert [e.detail["why"] for e in message.events.filter(kind="WAITING")] == ["retry after a transient failure"] * 2
    untouched(simulator, alice_instance)


def test_expired_waits_for_its_instance_until_deliver_until_then_fails_expired(magic, stack, simulator, alice_instance):
    # 15 s: a cold web worker on a loaded host may take 10 s to accept it
    until = (timezone.now() + timedelta(seconds=15)).isoformat()
    answer = send(stack, magic.test_key, EXPIRED, deliverUntil=until)
    assert answer.status_code == 202, answer.text

    message = finished(answer.json()["id"], "FAILED", timeout=60)

    assert message.failure_reason == "EXPIRED" and message.attempts == 0
    assert DeadLetter.objects.get(message=message).reason == "EXPIRED"
    waiting = message.events.get(kind="WAITING").detail
    assert waiting["why"] == "instance not connected" and waiting["simulated"] == "expired"
    assert kinds(message)[-2:] == ["FAILED", "DEAD_LETTERED"]
    assert message.failed_at >= message.deliver_until
    # the real instance was never marked down
    alice_instance.refresh_from_db()
    assert alice_instance.connection_state == "open"
    untouched(simulator, alice_instance)


def test_a_live_send_to_a_magic_number_goes_to_evolution(magic, stack, simulator, alice_instance):
    answer = send(stack, magic.live_key, READ)
    assert answer.status_code == 202, answer.text

    finished(answer.json()["id"], "READ")

    sends = simulator.sends(instance=alice_instance.name)
    assert [s["number"] for s in sends] == [READ.lstrip("+")]


def test_test_keys_still_refuse_other_numbers(magic, stack):
    answer = send(stack, magic.test_key, "+5511988887777")
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "test_recipient_not_allowed"


def test_a_magic_number_needs_an_opt_in_like_any_other(stack, simulator, alice, alice_instance):
    answer = send(stack, alice.test_key, DELIVERED)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "opt_in_required"


def test_the_openapi_schema_lists_the_magic_numbers(client):
    schema = client.get("/v1/schema/", HTTP_ACCEPT="application/json").json()
    description = schema["paths"]["/v1/messages/send"]["post"]["description"]
    for number, scenario in test_numbers.NUMBERS.items():
        assert number in description and scenario.name in description
