"""The circuit breaker on real Redis: opens, holds, half-opens with one probe, closes."""

from __future__ import annotations

import time

from messaging.sending import breaker

SCOPE = breaker.instance_scope("alice-main")


def fail_times(n: int, now: float, scope: str = SCOPE) -> list[str | None]:
    return [breaker.record(scope, breaker.FAIL, now) for _ in range(n)]


def test_it_opens_after_a_run_of_transient_failures(db, settings):
    settings.BREAKER_FAILURE_RUN = 3
    now = time.time()
    assert fail_times(2, now) == [None, None]
    assert breaker.check(SCOPE, now).allowed
    assert fail_times(1, now) == ["opened"]
    verdict = breaker.check(SCOPE, now + 1)
    assert not verdict.allowed and verdict.retry_at == now + settings.BREAKER_OPEN_SECONDS
    assert breaker.state_of(SCOPE, now + 1) == breaker.OPEN


def test_a_success_breaks_the_run(db, settings):
    settings.BREAKER_FAILURE_RUN = 3
    now = time.time()
    fail_times(2, now)
    breaker.record(SCOPE, breaker.OK, now)
    assert fail_times(2, now) == [None, None]
    assert breaker.state_of(SCOPE, now) == breaker.CLOSED


def test_it_opens_on_a_failure_rate_over_the_window(db, settings):
    settings.BREAKER_FAILURE_RUN = 100
    settings.BREAKER_MIN_CALLS = 10
    settings.BREAKER_FAILURE_RATE = 0.5
    now = time.time()
    results = []
    for _ in range(5):  # fail, ok, fail, ok …: never a run, but half of the calls fail
        results.append(breaker.record(SCOPE, breaker.FAIL, now))
        results.append(breaker.record(SCOPE, breaker.OK, now))
    assert "opened" not in results[:9]
    assert breaker.record(SCOPE, breaker.FAIL, now) == "opened"


def test_half_open_lets_exactly_one_probe_through_and_a_success_closes(db, settings):
    settings.BREAKER_FAILURE_RUN = 1
    now = time.time()
    fail_times(1, now)
    later = now + settings.BREAKER_OPEN_SECONDS + 1
    first, second = breaker.check(SCOPE, later), breaker.check(SCOPE, later)
    assert first.allowed and first.probe
    assert not second.allowed
    assert breaker.state_of(SCOPE, later) == breaker.HALF_OPEN
    assert breaker.record(SCOPE, breaker.OK, later) == "closed"
    assert breaker.state_of(SCOPE, later) == breaker.CLOSED
    assert breaker.check(SCOPE, later).allowed


def test_a_failed_probe_opens_the_circuit_for_another_period(db, settings):
    settings.BREAKER_FAILURE_RUN = 1
    now = time.time()
    fail_times(1, now)
    later = now + settings.BREAKER_OPEN_SECONDS + 1
    assert breaker.check(SCOPE, later).probe
    assert breaker.record(SCOPE, breaker.FAIL, later) == "opened"
    verdict = breaker.check(SCOPE, later + 1)
    assert not verdict.allowed and verdict.retry_at == later + settings.BREAKER_OPEN_SECONDS


def test_circuits_are_per_instance_and_per_gateway(db, settings):
    settings.BREAKER_FAILURE_RUN = 1
    now = time.time()
    fail_times(1, now)
    assert not breaker.check(SCOPE, now).allowed
    assert breaker.check(breaker.instance_scope("alice-second"), now).allowed
    assert breaker.check(breaker.GATEWAY, now).allowed


def test_opening_and_closing_are_counted_in_metrics(db, settings):
    from pilot_status import metrics

    settings.BREAKER_FAILURE_RUN = 1
    now = time.time()
    fail_times(1, now)
    breaker.check(SCOPE, now + settings.BREAKER_OPEN_SECONDS + 1)
    breaker.record(SCOPE, breaker.OK, now + settings.BREAKER_OPEN_SECONDS + 1)
    counters = metrics.read_all()
    assert counters["ps:metrics:evolution:breaker:instance:opened"] == 1
    assert counters["ps:metrics:evolution:breaker:instance:closed"] == 1


def test_the_per_process_store_keeps_the_same_rules(settings):
    settings.BREAKER_FAILURE_RUN = 2
    store = breaker.MemoryStore()
    now = time.time()
    assert store.fail("x", now)[0] == 1
    assert store.fail("x", now)[0] == 2
    store.set_open("x", now + 30)
    assert store.open_until("x") == now + 30
    assert store.try_probe("x", 10) and not store.try_probe("x", 10)
    store.close("x")
    assert store.open_until("x") is None


# ---- the breaker in the lane worker, against the simulator -----------------------------------

def test_the_worker_opens_holds_and_closes_the_circuit(simulator, alice, alice_instance, settings):
    from messaging.sending import worker
    from tests.messaging.sending_helpers import events, make_due, open_on_simulator, send

    settings.BREAKER_FAILURE_RUN = 3
    settings.BREAKER_OPEN_SECONDS = 1.0
    open_on_simulator(simulator, alice_instance, error_rate=1.0)
    failing = [send(alice, "MARKETING") for _ in range(3)]
    assert [worker.send_one(str(m.pk)) for m in failing] == ["retry"] * 3
    assert breaker.state_of(SCOPE) == breaker.OPEN

    # held: no request reaches Evolution and no attempt is used
    waiting = send(alice, "MARKETING")
    assert worker.send_one(str(waiting.pk)) == "held"
    waiting.refresh_from_db()
    assert waiting.status == "QUEUED" and waiting.attempts == 0
    assert events(waiting, "WAITING")[-1] == {**events(waiting, "WAITING")[-1], "why": "circuit open", "circuit": "instance"}
    assert len(simulator.sends(instance=alice_instance.name)) == 3

    # half-open after the open period: one probe goes out; its success closes the circuit
    simulator.faults(alice_instance.name, error_rate=0.0)
    time.sleep(settings.BREAKER_OPEN_SECONDS + 0.2)
    make_due(waiting)
    assert worker.send_one(str(waiting.pk)) == "sent"
    assert breaker.state_of(SCOPE) == breaker.CLOSED
    for message in failing:
        make_due(message)
        assert worker.send_one(str(message.pk)) == "sent"


def test_the_gateway_circuit_opens_when_evolution_is_unreachable(alice, alice_instance, settings):
    from messaging.sending import worker
    from tests.messaging.sending_helpers import events, make_due, send
    from tests.support.processes import free_port

    settings.BREAKER_GATEWAY_FAILURE_RUN = 2
    settings.BREAKER_FAILURE_RUN = 100
    settings.EVOLUTION_API_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    messages = [send(alice) for _ in range(3)]
    assert [worker.send_one(str(m.pk)) for m in messages[:2]] == ["retry", "retry"]
    assert breaker.state_of(breaker.GATEWAY) == breaker.OPEN
    assert worker.send_one(str(messages[2].pk)) == "held"
    assert events(messages[2], "WAITING")[-1]["circuit"] == "gateway"
    make_due(messages[2])
    assert Message_attempts(messages[2]) == 0


def Message_attempts(message) -> int:  # noqa: N802 - reads like the column it returns
    message.refresh_from_db()
    return message.attempts


def test_a_send_through_closed_circuits_breaks_the_run_once_it_is_recorded_sent(simulator, alice, alice_instance, settings):
    from messaging.sending import worker
    from tests.messaging.sending_helpers import open_on_simulator, send

    settings.BREAKER_FAILURE_RUN = 3
    open_on_simulator(simulator, alice_instance, error_rate=1.0)
    assert [worker.send_one(str(send(alice, "MARKETING").pk)) for _ in range(2)] == ["retry"] * 2

    simulator.faults(alice_instance.name, error_rate=0.0)
    sent = send(alice, "MARKETING")
    assert worker.send_one(str(sent.pk)) == "sent"
    sent.refresh_from_db()
    assert sent.status == "SENT"

    # the success reset both runs: two more failures do not open either circuit
    simulator.faults(alice_instance.name, error_rate=1.0)
    assert [worker.send_one(str(send(alice, "MARKETING").pk)) for _ in range(2)] == ["retry"] * 2
    assert breaker.state_of(SCOPE) == breaker.CLOSED
    assert breaker.state_of(breaker.GATEWAY) == breaker.CLOSED
