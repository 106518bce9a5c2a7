"""The one-statement accept (messaging.accept): the funnel's read folded into the write's guard.

A process remembers the candidate instances its last read found and judges the next request on
them; the write re-checks every fact that judgement rested on. Whatever changed since (an
instance's state, name, owner, the opt-in, the key), the answer must be the one fresh facts give.
"""

from __future__ import annotations

import itertools

import pytest
from django.db import OperationalError, connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from messaging import lifecycle, opt_ins
from messaging.accept import AnsweredBefore, SendRequest, accept_message
from messaging.errors import Rejected
from messaging.models import ApiKey, Instance, Message, MessageEvent, OptIn, OutboxEntry
from tests.conftest import add_instance
from tests.messaging.test_accept_path import LAYOUTS, RECIPIENT, former_check_funnel

OPTED = "+5511988880001"


def outcome(project, key, req):
    try:
        return accept_message(project, key, "LIVE", req)["instance"]
    except Rejected as rejected:
        return rejected.code


def live_key(actor):
    return ApiKey.objects.get(project=actor.project, environment="LIVE")


def flip(instance):
    state = "close" if Instance.objects.get(pk=instance.pk).connection_state == "open" else "open"
    Instance.objects.filter(pk=instance.pk).update(connection_state=state)  # no signal: behind the cache


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name != "nothing"])
def test_a_remembered_choice_never_outlives_the_facts_it_rests_on(alice, carol, layout):
    created = []
    for name, own, official, priority, state in LAYOUTS[layout]:
        instance = add_instance(alice.project if own else None, name, official=official, priority=priority)
        Instance.objects.filter(pk=instance.pk).update(connection_state=state)
        created.append(instance)
    add_instance(carol.project, "carol-main")
    opt_ins.record(alice.project, OPTED, "form")
    key = live_key(alice)
    names = [None, "carol-main", *[i.name for i in created[:2]]]
    combos = list(itertools.product(("OTP", "UTILITY", "MARKETING"), (OPTED, RECIPIENT), names))
    for category, to, requested in combos:  # remember every group's candidates
        outcome(alice.project, key, SendRequest(to=to, category=category, template="hi", instance=requested))
    def revoke_the_opt_in():
        OptIn.objects.filter(project=alice.project, phone=OPTED).update(revoked_at=timezone.now())

    changes = [(i.name, lambda i=i: flip(i)) for i in created] + [("opt-in revoked", revoke_the_opt_in)]
    for change, apply in changes:  # then change one fact at a time behind the process's back
        apply()
        for category, to, requested in combos:
            req = SendRequest(to=to, category=category, template="hi", instance=requested)
            assert outcome(alice.project, key, req) == former_check_funnel(alice.project, "LIVE", req), (
                layout, change, category, to, requested)


def test_the_usual_accept_is_one_statement_and_writes_what_the_two_statement_path_writes(alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "form")
    key = live_key(alice)
    req = SendRequest(to=RECIPIENT, category="UTILITY", template="Hello {{n}}", variables={"n": 1},
                      metadata={"order": 7})
    bodies = []
    for statements in (2, 1):
        with CaptureQueriesContext(connection) as queries:
            bodies.append(accept_message(alice.project, key, "LIVE", req))
        assert len(queries) == statements

    def written(body):
        message = Message.objects.get(pk=body["id"])
        event = MessageEvent.objects.get(message=message)
        entry = OutboxEntry.objects.get(message=message)
        return (
            {f.attname: getattr(message, f.attname) for f in Message._meta.concrete_fields
             if f.attname not in ("id", "created_at", "updated_at", "next_attempt_at", "deliver_until")},
            (event.kind, event.actor, event.detail),
            (entry.lane, entry.project_id_copy, entry.priority),
        )

    assert written(bodies[0]) == written(bodies[1])
    assert {k: v for k, v in bodies[0].items() if k not in ("id", "createdAt", "deliverUntil")} == {
        k: v for k, v in bodies[1].items() if k not in ("id", "createdAt", "deliverUntil")}


def test_a_renamed_instance_answers_with_its_new_name(alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "form")
    key = live_key(alice)
    req = SendRequest(to=RECIPIENT, category="UTILITY", template="hi")
    assert outcome(alice.project, key, req) == "alice-main"
    Instance.objects.filter(pk=alice_instance.pk).update(name="alice-renamed")
    body = accept_message(alice.project, key, "LIVE", req)
    assert body["instance"] == "alice-renamed"
    assert MessageEvent.objects.get(message_id=body["id"]).detail == {"instance": "alice-renamed"}


def test_an_instance_moved_to_another_project_is_not_used(alice, alice_instance, carol):
    opt_ins.record(alice.project, RECIPIENT, "form")
    key = live_key(alice)
    req = SendRequest(to=RECIPIENT, category="UTILITY", template="hi", instance="alice-main")
    assert outcome(alice.project, key, req) == "alice-main"
    Instance.objects.filter(pk=alice_instance.pk).update(project=carol.project)
    assert outcome(alice.project, key, req) == "unknown_instance"


def test_a_revoked_opt_in_and_a_revoked_key_refuse_at_once(alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "form")
    key = live_key(alice)
    req = SendRequest(to=RECIPIENT, category="MARKETING", template="hi")
    assert outcome(alice.project, key, req) == "alice-main"
    OptIn.objects.filter(project=alice.project, phone=RECIPIENT).update(revoked_at=timezone.now())
    assert outcome(alice.project, key, req) == "opt_in_required"
    opt_ins.record(alice.project, RECIPIENT, "form again")
    assert outcome(alice.project, key, req) == "alice-main"
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    with pytest.raises(Rejected) as refused:
        accept_message(alice.project, key, "LIVE", req)
    assert refused.value.status == 401
    assert Message.objects.filter(project=alice.project).count() == 2


def test_a_used_idempotency_key_is_answered_not_written_again(alice, alice_instance):
    opt_ins.record(alice.project, RECIPIENT, "form")
    key = live_key(alice)
    req = SendRequest(to=RECIPIENT, category="UTILITY", template="hi")
    accept_message(alice.project, key, "LIVE", req)  # remembers the candidates
    first = accept_message(alice.project, key, "LIVE", req, "order-1", "hash")
    with pytest.raises(AnsweredBefore) as again:
        accept_message(alice.project, key, "LIVE", req, "order-1", "hash")
    assert again.value.record.response == first
    assert Message.objects.filter(project=alice.project).count() == 2


def test_a_write_that_committed_before_its_connection_broke_is_not_written_twice(
    transactional_db, alice, alice_instance, monkeypatch
):
    opt_ins.record(alice.project, RECIPIENT, "form")
    key = live_key(alice)
    req = SendRequest(to=RECIPIENT, category="UTILITY", template="hi")
    accept_message(alice.project, key, "LIVE", req)
    real_write = lifecycle.accept

    def commit_then_lose_the_answer(*args, **kwargs):
        real_write(*args, **kwargs)  # committed (autocommit, one statement)...
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:  # ...and the connection dies before we hear so
                cursor.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
        finally:
            other.close()
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(lifecycle, "accept", commit_then_lose_the_answer)
    connection.health_check_done = False  # a new request on the pooled connection
    body = accept_message(alice.project, key, "LIVE", req)
    assert Message.objects.filter(project=alice.project).count() == 2
    assert Message.objects.filter(pk=body["id"]).exists()


def test_an_otp_without_opt_in_goes_through_the_official_number_in_one_statement(alice, alice_instance):
    official = add_instance(None, "ps-official", official=True, priority=1)
    opt_ins.record(alice.project, OPTED, "form")
    key = live_key(alice)
    without = SendRequest(to=RECIPIENT, category="OTP", template="code 1")
    with_opt_in = SendRequest(to=OPTED, category="OTP", template="code 2")
    assert outcome(alice.project, key, without) == official.name  # read: no opt-in
    with CaptureQueriesContext(connection) as queries:
        assert outcome(alice.project, key, without) == official.name
    assert len(queries) == 1
    # the bet on "no opt-in" loses for an opted-in recipient: the two-statement path decides
    assert outcome(alice.project, key, with_opt_in) == "alice-main"
    with CaptureQueriesContext(connection) as queries:
        assert outcome(alice.project, key, with_opt_in) == "alice-main"
    assert len(queries) == 1
    # and an opt-in given or revoked behind the bet is seen at once
    opt_ins.record(alice.project, RECIPIENT, "form")
    assert outcome(alice.project, key, without) == "alice-main"
    OptIn.objects.filter(project=alice.project, phone=RECIPIENT).update(revoked_at=timezone.now())
    assert outcome(alice.project, key, without) == official.name


def test_the_guard_rechecks_only_the_groups_the_choice_read(alice, alice_instance):
    shared = add_instance(None, "ps-shared", priority=5)
    opt_ins.record(alice.project, RECIPIENT, "form")
    key = live_key(alice)
    req = SendRequest(to=RECIPIENT, category="UTILITY", template="hi")
    assert outcome(alice.project, key, req) == "alice-main"
    flip(shared)  # the own instance is open: the shared one plays no part in the choice
    with CaptureQueriesContext(connection) as queries:
        assert outcome(alice.project, key, req) == "alice-main"
    assert len(queries) == 1
    flip(alice_instance)  # now it does: closed own instance → the shared fallback, on fresh facts
    assert outcome(alice.project, key, req) == former_check_funnel(alice.project, "LIVE", req)
