"""Instance fallback (issue 4 §4): a message whose instance is down or has an open circuit is
re-routed to the next open instance by priority, within the contract's rules."""

from __future__ import annotations

import time

from tests.conftest import add_instance
from messaging.sending import breaker, worker
from tests.messaging.sending_helpers import events, open_on_simulator, send, sends_ok


def test_it_reroutes_to_the_next_open_instance_by_priority(simulator, alice, alice_instance):
    second = add_instance(alice.project, "alice-second", priority=20)
    third = add_instance(alice.project, "alice-third", priority=30)
    open_on_simulator(simulator, alice_instance, second, third)
    simulator.instance(alice_instance.name, state="close")
    message = send(alice, "MARKETING")
    assert message.instance == alice_instance

    assert worker.send_one(str(message.pk)) == "sent"
    message.refresh_from_db()
    assert message.instance == second
    assert events(message, "REROUTED") == [{"from": "alice-main", "to": "alice-second", "why": "instance not connected"}]
    assert len(sends_ok(simulator, "alice-second")) == 1 and sends_ok(simulator, "alice-main") == []


def test_it_reroutes_away_from_an_open_circuit(simulator, alice, alice_instance, settings):
    settings.BREAKER_FAILURE_RUN = 1
    second = add_instance(alice.project, "alice-second", priority=20)
    open_on_simulator(simulator, alice_instance, second)
    breaker.record(breaker.instance_scope(alice_instance.name), breaker.FAIL, time.time())
    message = send(alice)
    assert worker.send_one(str(message.pk)) == "sent"
    assert events(message, "REROUTED")[0]["why"] == "circuit open"
    assert len(sends_ok(simulator, "alice-second")) == 1


def test_marketing_never_falls_back_to_a_pilot_status_instance(simulator, alice, alice_instance):
    shared = add_instance(None, "pilot-default", priority=5)
    open_on_simulator(simulator, alice_instance, shared)
    simulator.instance(alice_instance.name, state="close")
    message = send(alice, "MARKETING")
    assert worker.send_one(str(message.pk)) == "held"
    assert events(message, "REROUTED") == []
    assert simulator.sends(instance="pilot-default") == []


def test_utility_may_fall_back_to_the_pilot_status_default(simulator, alice, alice_instance):
    shared = add_instance(None, "pilot-default", priority=5)
    open_on_simulator(simulator, alice_instance, shared)
    simulator.instance(alice_instance.name, state="close")
    message = send(alice, "UTILITY")
    assert worker.send_one(str(message.pk)) == "sent"
    assert events(message, "REROUTED")[0]["to"] == "pilot-default"


def test_an_otp_without_opt_in_only_falls_back_to_an_official_number(simulator, alice, official_instance):
    shared = add_instance(None, "pilot-default", priority=5)
    backup = add_instance(None, "pilot-official-2", official=True, priority=2)
    open_on_simulator(simulator, official_instance, shared, backup)
    simulator.instance(official_instance.name, state="close")
    message = send(alice, "OTP", opt_in=False)
    assert message.instance == official_instance

    assert worker.send_one(str(message.pk)) == "sent"
    message.refresh_from_db()
    assert message.instance == backup
    assert simulator.sends(instance="pilot-default") == []


def test_an_otp_without_opt_in_waits_when_no_official_number_is_open(simulator, alice, official_instance, alice_instance):
    shared = add_instance(None, "pilot-default", priority=5)
    open_on_simulator(simulator, official_instance, shared, alice_instance)
    simulator.instance(official_instance.name, state="close")
    message = send(alice, "OTP", opt_in=False)
    assert worker.send_one(str(message.pk)) == "held"
    assert events(message, "REROUTED") == []


def test_an_explicitly_chosen_instance_is_not_rerouted(simulator, alice, alice_instance):
    second = add_instance(alice.project, "alice-second", priority=20)
    open_on_simulator(simulator, alice_instance, second)
    simulator.instance(alice_instance.name, state="close")
    message = send(alice, "MARKETING", instance="alice-main")
    assert worker.send_one(str(message.pk)) == "held"
    assert events(message, "REROUTED") == []


def test_one_rule_says_which_owners_a_message_may_go_through():
    # The re-route (rules.fallback_instances) and the relay's judgement of a held cold contact
    # (sending.human_pace) both ask it: the project's own numbers, and Pilot Status' shared ones except for MARKETING.
    from messaging.rules import may_route_to

    assert [may_route_to(category, 7, owner) for category in ("OTP", "UTILITY", "MARKETING") for owner in (7, None, 8)] == [
        True, True, False,
        True, True, False,
        True, False, False,
    ]
