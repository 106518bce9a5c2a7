"""bench.backlog.bulk_accept must write what messaging.accept.accept_message writes, row for row."""

from __future__ import annotations

from typing import Any

from django.forms.models import model_to_dict

from bench.backlog import bulk_accept
from messaging import opt_ins
from messaging.accept import SendRequest, accept_message
from messaging.models import ApiKey, Message, MessageEvent, OutboxEntry

# Fields that differ between any two messages (identity, clocks) or by design of the comparison.
VOLATILE = {"id", "message", "created_at", "updated_at", "next_attempt_at", "deliver_until", "available_at",
            "variables", "text"}


def _row(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in model_to_dict(obj).items() if k not in VOLATILE}


def test_it_writes_the_same_rows_as_the_accept_function(alice, alice_instance):
    # given: a recipient with an opt-in and alice's live key
    opt_ins.record(alice.project, "+5511988880000", "bench")
    key = ApiKey.objects.get(project=alice.project, environment="LIVE")
    req = SendRequest(to="+5511988880000", category="MARKETING", template="Bench {{n}}", variables={"n": "0"})

    # when: one message goes through each path
    accepted_id = accept_message(alice.project, key, key.environment, req)["id"]
    [bulk_id] = bulk_accept(alice.project, key, ["+5511988880000"], 1, "MARKETING")

    # then: message, timeline and outbox rows agree on everything but identity and clocks
    accepted, bulk = Message.objects.get(pk=accepted_id), Message.objects.get(pk=bulk_id)
    assert _row(bulk) == _row(accepted)
    assert bulk.text == "Bench 0" and accepted.text == "Bench 0"
    assert [_row(e) for e in MessageEvent.objects.filter(message=bulk)] == [
        _row(e) for e in MessageEvent.objects.filter(message=accepted)
    ]
    assert [_row(o) for o in OutboxEntry.objects.filter(message=bulk)] == [
        _row(o) for o in OutboxEntry.objects.filter(message=accepted)
    ]
    assert bulk.deliver_until - bulk.created_at == accepted.deliver_until - accepted.created_at
