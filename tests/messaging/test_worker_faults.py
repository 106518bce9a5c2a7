"""One fault mode per test: the lane worker's unit of work (send_one) against the simulator over
real HTTP, on real Postgres and Redis. Time passing between attempts is made explicit (make_due)."""

from __future__ import annotations

from datetime import timedelta

from messaging.models import Message
from messaging.sending import worker
from pilot_status import metrics
from tests.messaging.sending_helpers import (
    assert_dead_lettered,
    events,
    make_due,
    open_on_simulator,
    send,
    sends_ok,
)


def test_it_retries_a_5xx_burst_then_sends(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance, error_sequence=[500, 502, 500])
    message = send(alice)
    results = []
    for _ in range(4):
        results.append(worker.send_one(str(message.pk)))
        make_due(message)
    assert results == ["retry", "retry", "retry", "sent"]
    message.refresh_from_db()
    assert message.status == "SENT" and message.attempts == 4
    attempts = events(message, "ATTEMPT")
    assert [a["httpStatus"] for a in attempts] == [500, 502, 500, 201]
    assert [a["outcome"] for a in attempts] == ["transient"] * 3 + ["sent"]
    assert attempts[0]["body"]  # the gateway's answer is kept in the timeline
    assert len(sends_ok(simulator, alice_instance.name)) == 1


def test_ten_transient_failures_fail_with_retries_exhausted(simulator, alice, alice_instance, settings):
    settings.BREAKER_FAILURE_RUN = 100  # this test is about the attempt budget, not the circuit
    open_on_simulator(simulator, alice_instance, error_rate=1.0, error_status=503)
    message = send(alice, "MARKETING")
    results = []
    for _ in range(10):
        results.append(worker.send_one(str(message.pk)))
        make_due(message)
    assert results == ["retry"] * 9 + ["failed"]
    letter = assert_dead_lettered(message, "RETRIES_EXHAUSTED")
    assert letter.attempts == 10
    assert len(events(message, "ATTEMPT")) == 10
    assert worker.send_one(str(message.pk)) == worker.NOTHING_TO_CLAIM


def test_an_otp_gets_only_the_tries_that_fit_before_deliver_until(simulator, alice, alice_instance, settings):
    settings.BREAKER_FAILURE_RUN = 100
    open_on_simulator(simulator, alice_instance, error_rate=1.0)
    message = send(alice, "OTP")
    results = []
    while (result := worker.send_one(str(message.pk))) == "retry":
        results.append(result)
        make_due(message)
    assert result == "failed"
    assert_dead_lettered(message, "EXPIRED")
    message.refresh_from_db()
    # 5 s, 15 s, 45 s fit in two minutes; the next 2¼ min wait does not, so a last attempt comes
    # in the deadline's final seconds, and the message expires after it.
    assert message.attempts == 5
    assert len(simulator.sends(instance=alice_instance.name)) == message.attempts
    assert message.deliver_until - message.failed_at <= timedelta(seconds=6)


def test_a_deleted_instance_fails_at_once_with_instance_not_found(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance)
    simulator.instance(alice_instance.name, deleted=True)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "failed"
    letter = assert_dead_lettered(message, "INSTANCE_NOT_FOUND")
    assert letter.last_gateway_response["httpStatus"] == 404
    assert Message.objects.get(pk=message.pk).attempts == 1


def test_a_number_not_on_whatsapp_fails_with_invalid_recipient(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance, not_on_whatsapp=["+5511988887777"])
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "failed"
    letter = assert_dead_lettered(message, "INVALID_RECIPIENT")
    assert "not on WhatsApp" in letter.detail


def test_a_disconnected_instance_waits_without_using_an_attempt(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance)
    simulator.instance(alice_instance.name, state="close")
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "held"
    message.refresh_from_db()
    assert message.status == "QUEUED" and message.attempts == 0
    assert message.next_attempt_at > message.created_at
    assert events(message, "WAITING")[-1]["why"] == "instance not connected"
    assert simulator.sends(instance=alice_instance.name) == []
    alice_instance.refresh_from_db()
    assert alice_instance.connection_state == "close"


def test_a_connection_closed_answer_waits_without_using_an_attempt(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance)
    message = send(alice)
    from messaging.sending import instance_state

    instance_state.remember(alice_instance.name, "open")  # our cached view is a moment old
    simulator.instance(alice_instance.name, state="close")
    assert worker.send_one(str(message.pk)) == "waiting"
    message.refresh_from_db()
    assert message.status == "QUEUED" and message.attempts == 0
    waiting = events(message, "WAITING")[-1]
    assert waiting["outcome"] == "disconnected" and waiting["httpStatus"] == 500


def test_a_reconnect_releases_the_waiting_messages(simulator, alice, alice_instance):
    from messaging.models import OutboxEntry
    from messaging.sending import instance_state

    open_on_simulator(simulator, alice_instance)
    simulator.instance(alice_instance.name, state="close")
    message = send(alice)
    OutboxEntry.objects.filter(message=message).delete()  # the relay released the first one
    assert worker.send_one(str(message.pk)) == "held"
    entry = OutboxEntry.objects.get(message=message)
    assert entry.available_at > message.created_at

    # when: the instance reconnects and the state poll (beat) notices
    simulator.instance(alice_instance.name, state="open")
    assert instance_state.poll_waiting() == 1

    entry.refresh_from_db()
    assert entry.available_at <= Message.objects.get(pk=message.pk).next_attempt_at
    make_due(message)
    assert worker.send_one(str(message.pk)) == "sent"
    assert Message.objects.get(pk=message.pk).attempts == 1


def test_a_slow_gateway_still_sends_once(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance, latency_ms=400)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "sent"
    assert events(message, "ATTEMPT")[0]["elapsedMs"] >= 400
    assert len(sends_ok(simulator, alice_instance.name)) == 1


def test_a_timeout_before_sending_is_retried_after_checking_evolution(simulator, alice, alice_instance, settings):
    settings.EVOLUTION_READ_TIMEOUT = 0.5
    open_on_simulator(simulator, alice_instance, hang_rate=1.0, hang_ms=1500)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    message.refresh_from_db()
    assert message.unconfirmed_attempt_at is not None and message.attempts == 1
    assert events(message, "ATTEMPT")[0]["outcome"] == "unknown"

    simulator.faults(alice_instance.name, hang_rate=0.0)
    make_due(message)
    assert worker.send_one(str(message.pk)) == "sent"  # findMessages found nothing: sent now
    assert len(sends_ok(simulator, alice_instance.name)) == 1


def test_a_timeout_after_sending_is_confirmed_not_resent(simulator, alice, alice_instance, settings):
    settings.EVOLUTION_READ_TIMEOUT = 0.5
    open_on_simulator(simulator, alice_instance, hang_rate=1.0, hang_ms=1500, hang_after_send=True)
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "retry"
    make_due(message)
    assert worker.send_one(str(message.pk)) == "confirmed_sent"
    message.refresh_from_db()
    sent = sends_ok(simulator, alice_instance.name)
    assert len(sent) == 1 and message.status == "SENT"
    assert message.evolution_message_id == sent[0]["id"]


def test_a_refused_apikey_is_loud_and_uses_no_attempt(simulator, alice, alice_instance):
    open_on_simulator(simulator, alice_instance, error_sequence=[401])
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "waiting"
    message.refresh_from_db()
    assert message.status == "QUEUED" and message.attempts == 0
    alice_instance.refresh_from_db()
    assert alice_instance.last_gateway_error.startswith("HTTP 401")
    assert metrics.read_all()["ps:metrics:evolution:gateway:misconfigured"] == 1


def test_sending_goes_on_when_redis_is_unreachable(simulator, alice, alice_instance, settings):
    # Nothing listens on port 1: every Redis call fails for real; breaker and cache run per process.
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
        }
    }
    from messaging.sending import breaker

    open_on_simulator(simulator, alice_instance)
    message = send(alice)
    try:
        assert worker.send_one(str(message.pk)) == "sent"
        assert breaker.instance_scope(alice_instance.name) in breaker.local_store.scopes
    finally:
        breaker.reset_local()
    assert len(sends_ok(simulator, alice_instance.name)) == 1


def test_a_connection_closed_answer_is_believed_over_a_stale_open_state(simulator, alice, alice_instance):
    # given: Evolution's connectionState still says open, but sendText answers Connection Closed
    open_on_simulator(
        simulator, alice_instance,
        error_rate=1.0, error_status=500,
        error_body={"status": 500, "error": "Internal Server Error", "response": {"message": "Connection Closed"}},
    )
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "waiting"

    # when: the message is claimed again after the short state cache would have expired
    from messaging.sending import instance_state

    instance_state._local.clear()
    from pilot_status import metrics

    for key in metrics.redis().scan_iter(match="ps:instance-state:*"):
        ttl = metrics.redis().pttl(key)
        assert ttl > 3000  # held for the smart wait, not the 3 s cache
    make_due(message)

    # then: it is held without asking Evolution again
    assert worker.send_one(str(message.pk)) == "held"
    assert len(simulator.sends(instance=alice_instance.name)) == 1


def test_a_state_evolution_confirms_is_not_written_again(simulator, alice_instance):
    """A lane thread asks connectionState without a pooled connection (release_while_waiting): when Evolution says
    what the row already holds, nothing is written, so the thread needs no connection back only to write nothing;
    with the pool busy, that write timed out and failed the task after its claim, the message held until its lease ran out."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from messaging.sending import instance_state

    open_on_simulator(simulator, alice_instance)
    alice_instance.set_connection_state("open")
    instance_state._local.clear()
    for key in metrics.redis().scan_iter(match="ps:instance-state:*"):
        metrics.redis().delete(key)

    with CaptureQueriesContext(connection) as queries:
        assert instance_state.current(alice_instance) == "open"

    assert [q["sql"] for q in queries.captured_queries] == []
