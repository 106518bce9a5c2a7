"""Sending on the real stack (gunicorn, relay, consumer, one Celery worker per lane) against the
simulator's faults: no duplicate under redelivery, nothing lost to a SIGKILL, a paced release
after a reconnect (measured at the simulator), and an OTP that never waits behind marketing."""

from __future__ import annotations

import signal
from datetime import timedelta

import requests
from django.conf import settings
from django.utils import timezone

from messaging import dispatch, opt_ins, reconciler
from messaging.accept import SendRequest, accept_message
from messaging.models import Environment, Message
from messaging.sending import pacing
from pilot_status.celery import SEND_TASK, app
from tests.support.simulator import wait_until

RECIPIENT = "+5511988887777"


def api_send(stack, actor, category: str = "UTILITY", text: str = "Order {{n}} shipped") -> str:
    response = requests.post(
        f"{stack.web_url}/v1/messages/send",
        json={"to": RECIPIENT, "category": category, "text": text, "variables": {"n": "42"}},
        headers={"Authorization": f"Bearer {actor.live_key}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    return response.json()["id"]


def status_of(message_id: str) -> str:
    return Message.objects.get(pk=message_id).status


def sent_ids(simulator, instance: str) -> list[dict]:
    return [s for s in simulator.sends(instance=instance) if s.get("id")]


def assert_paced(stamps: list[float], rate: float) -> None:
    """Measured at Evolution: n sends never come faster than the bucket allows (burst, then the rate)."""
    burst = pacing.burst_for(rate)
    for i in range(len(stamps)):
        for j in range(i + burst, len(stamps)):
            assert stamps[j] - stamps[i] >= (j - i - burst) / rate - 0.05, (i, j, stamps)


def test_the_same_task_delivered_twenty_times_sends_once(stack, simulator, alice, alice_instance):
    simulator.register(alice_instance, stack.webhook_url)
    simulator.faults(alice_instance.name, latency_ms=300)  # keep the first send in flight a while
    opt_ins.record(alice.project, RECIPIENT, "form")
    message_id = api_send(stack, alice)

    with app.producer_or_acquire() as producer:
        for _ in range(20):
            app.send_task(SEND_TASK, args=[message_id], queue="utility", routing_key="utility", producer=producer)

    wait_until(lambda: status_of(message_id) in ("SENT", "SERVER_ACK", "DELIVERED", "READ"), timeout=30)
    wait_until(lambda: Message.objects.get(pk=message_id).dispatched_at is None
               or app.connection_for_read().default_channel.queue_declare("utility", passive=True).message_count == 0,
               timeout=30, message="the duplicate tasks were consumed")
    assert len(simulator.sends(instance=alice_instance.name)) == 1
    assert Message.objects.get(pk=message_id).attempts == 1


def test_a_worker_killed_mid_send_loses_nothing_and_sends_once(stack, simulator, alice, alice_instance):
    simulator.register(alice_instance, stack.webhook_url)
    # Evolution sends, then its answer hangs: the worker is inside the HTTP call when it dies. WhatsApp's receipts
    # would settle the message at once (they match its own id); without them only its lease is left to recover.
    simulator.faults(alice_instance.name, hang_rate=1.0, hang_ms=8000, hang_after_send=True,
                     ack_delays_ms={"SERVER_ACK": None, "DELIVERY_ACK": None, "READ": None})
    opt_ins.record(alice.project, RECIPIENT, "form")
    message_id = api_send(stack, alice)
    wait_until(lambda: sent_ids(simulator, alice_instance.name), timeout=20, message="Evolution sent it")
    assert status_of(message_id) == "SENDING"

    stack.restart("worker-utility", signal.SIGKILL)
    simulator.faults(alice_instance.name, hang_rate=0.0)
    # The lease runs out (SEND_LEASE_SECONDS); then the reconciler's beat pass finds it.
    Message.objects.filter(pk=message_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reconciler.run_batch().leases_recovered == 1

    message = wait_until(
        lambda: Message.objects.filter(pk=message_id, status__in=["SENT", "SERVER_ACK", "DELIVERED", "READ"]).first(),
        timeout=60, message="sent after recovery",
    )
    sends = sent_ids(simulator, alice_instance.name)
    assert len(sends) == 1  # findMessages confirmed the dead worker's send: no duplicate
    assert message.evolution_message_id == sends[0]["id"]
    kinds = list(message.events.values_list("kind", flat=True))
    assert "RECOVERED" in kinds


def test_a_reconnect_releases_the_backlog_at_the_instance_pace(stack, simulator, alice, alice_instance):
    rate = 4.0
    alice_instance.send_rate_per_second = rate
    alice_instance.save()
    simulator.register(alice_instance, stack.webhook_url)
    # A dropped connection (Baileys' 428, connection closed), not a logout: a logged-out number rests
    # (docs/sending-policy.md, "Health governor"), official or not.
    simulator.instance(alice_instance.name, state="close", status_reason=428)
    opt_ins.record(alice.project, RECIPIENT, "form")
    ids = [api_send(stack, alice, text=f"backlog {i}") for i in range(16)]
    wait_until(lambda: Message.objects.filter(pk__in=ids, events__kind="WAITING").distinct().count() == 16,
               timeout=30, message="all held while disconnected")
    assert simulator.sends(instance=alice_instance.name) == []

    # when: the phone reconnects (Evolution's connection.update webhook reaches ingestion)
    simulator.instance(alice_instance.name, state="open")

    wait_until(lambda: len(sent_ids(simulator, alice_instance.name)) >= 16, timeout=60, message="backlog sent")
    assert len(sent_ids(simulator, alice_instance.name)) == 16
    assert_paced(sorted(s["at"] for s in sent_ids(simulator, alice_instance.name)), rate)
    # The simulator records a send before the worker commits it: wait for the last commits.
    wait_until(lambda: not Message.objects.filter(pk__in=ids, status__in=["QUEUED", "SENDING"]).exists(),
               timeout=30, message="every send recorded")
    for message in Message.objects.filter(pk__in=ids):
        assert message.attempts == 1


def test_a_backlog_that_waited_in_the_lane_queue_still_reaches_evolution_at_the_pace(stack, simulator, alice,
                                                                                     alice_instance):
    # given: the relay released a paced backlog while the lane's worker was away (bench B4 saw the
    # workers catch up on such a queue faster than the cap)
    rate = 4.0
    alice_instance.send_rate_per_second = rate
    alice_instance.save()
    simulator.register(alice_instance, stack.webhook_url)
    opt_ins.record(alice.project, RECIPIENT, "form")
    stack.processes["worker-utility"].stop()
    ids = [api_send(stack, alice, text=f"queued {i}") for i in range(16)]
    wait_until(lambda: dispatch.lane_depths(("utility",))["utility"] == 16, timeout=30,
               message="the relay released all 16 into the lane queue")

    # when: the worker comes back to a full queue
    stack.restart("worker-utility")

    # then: Evolution is asked at the instance's pace, not at the worker's speed
    wait_until(lambda: len(sent_ids(simulator, alice_instance.name)) >= 16, timeout=60, message="backlog sent")
    assert_paced(sorted(s["at"] for s in sent_ids(simulator, alice_instance.name)), rate)
    wait_until(lambda: not Message.objects.filter(pk__in=ids, status__in=["QUEUED", "SENDING"]).exists(),
               timeout=30, message="every send recorded")
    assert sorted(Message.objects.filter(pk__in=ids).values_list("attempts", flat=True)) == [1] * 16


def test_an_otp_is_sent_while_a_marketing_backlog_drains(stack, simulator, alice, alice_instance, official_instance):
    """An OTP never waits behind marketing (docs/architecture.md, principle 4). Here it shares alice-main with a backlog of
    150 marketing messages, so marketing rightly goes on at that number's pace while the OTP crosses
    the relay and its worker; waiting behind the backlog would show as the backlog's sends piling up
    ahead of it at Evolution (an OTP 2 s late lets 10 through at 5/s). So: between the OTP's accept
    (the product's stamp, as bench B3 measures) and the OTP itself, Evolution receives no more
    marketing sends than one burst of the number's pace (SEND_RATE_BURST). A count of sends in the
    order Evolution got them, not a wall-clock bound."""
    # The number's pace, from its sending policy: 5/s. Marketing goes on at that pace while the OTP crosses the relay
    # and its worker, so one burst (10) is 2 s of the OTP's own way through a loaded host, and the backlog lasts 30 s.
    alice_instance.send_policy = {**alice_instance.send_policy, "rate_per_second": 5}
    alice_instance.save(update_fields=["send_policy"])
    simulator.register(alice_instance, stack.webhook_url)
    simulator.register(official_instance, stack.webhook_url)
    simulator.faults(alice_instance.name, latency_ms=50)
    opt_ins.record(alice.project, RECIPIENT, "form")
    backlog = [
        accept_message(alice.project, None, Environment.LIVE, SendRequest(RECIPIENT, "MARKETING", f"promo {i}"))["id"]
        for i in range(150)
    ]
    wait_until(lambda: sent_ids(simulator, alice_instance.name), timeout=30, message="marketing started")

    otp_id = api_send(stack, alice, category="OTP", text="Your code is {{n}}")
    wait_until(lambda: status_of(otp_id) not in ("QUEUED", "SENDING"), timeout=30, message="OTP sent")

    otp = Message.objects.get(pk=otp_id)
    assert otp.status in ("SENT", "SERVER_ACK", "DELIVERED", "READ")
    assert otp.instance_id == alice_instance.pk  # the number the backlog drains through
    sends = simulator.sends(instance=alice_instance.name)
    [otp_at] = [n for n, send in enumerate(sends) if send["text"] == "Your code is 42"]
    accepted = otp.created_at.timestamp()
    ahead = [send["text"] for send in sends[:otp_at] if send["at"] >= accepted]
    assert all(text.startswith("promo ") for text in ahead), ahead
    assert len(ahead) <= settings.SEND_RATE_BURST, f"the OTP waited behind {len(ahead)} marketing sends: {ahead}"
    still_waiting = Message.objects.filter(pk__in=backlog, status__in=["QUEUED", "SENDING"]).count()
    assert still_waiting > 0  # the OTP did not wait for the marketing lane to drain
