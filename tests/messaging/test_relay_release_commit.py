"""A release that did not commit after the broker confirmed its tasks (messaging.dispatch).

The relay publishes a pass's tasks, waits for the broker's confirms, then commits. If the commit is lost (the
relay's connection drops at that moment, or the database crashes), the outbox entry is back while its task is
already queued: the worker claims and sends it, and the relay later releases the same entry again. That second
release must cost nothing but a task the lease claim ignores.
"""

from __future__ import annotations

from messaging import dispatch
from messaging.models import EventKind, Message, MessageEvent, OutboxEntry
from messaging.sending import worker
from tests.messaging.sending_helpers import open_on_simulator, send, sends_ok


def lose_the_release(message: Message, entry: OutboxEntry) -> None:
    """What the database holds when a release's commit was lost: the entry, no stamp, no DISPATCHED line."""
    OutboxEntry.objects.create(message=message, project_id_copy=entry.project_id_copy, lane=entry.lane,
                               priority=entry.priority, available_at=entry.available_at)
    Message.objects.filter(pk=message.pk).update(dispatched_at=None)
    MessageEvent.objects.filter(message=message, kind=EventKind.DISPATCHED).delete()


def test_a_release_whose_commit_was_lost_sends_once_and_never_lists_a_dispatch_after_the_send(
    transactional_db, empty_lanes, simulator, alice, alice_instance
):
    open_on_simulator(simulator, alice_instance)
    message = send(alice)
    entry = OutboxEntry.objects.get(message=message)
    assert dispatch.release_due(lanes=(message.lane,)).released == 1
    lose_the_release(message, entry)
    # the task the broker confirmed reaches a worker, which claims and sends
    assert worker.send_one(str(message.pk)) == "sent"

    # when: the relay finds the entry again
    assert dispatch.release_due(lanes=(message.lane,)).released == 1

    # then: its task claims nothing, the entry is gone, and Evolution got one send
    assert worker.send_one(str(message.pk)) == worker.NOTHING_TO_CLAIM
    assert not OutboxEntry.objects.filter(message=message).exists()
    assert len(sends_ok(simulator, alice_instance.name)) == 1
    # and the sent message is neither stamped nor listed as dispatched after its send
    message.refresh_from_db()
    assert message.status == "SENT" and message.dispatched_at is None
    assert not message.events.filter(kind=EventKind.DISPATCHED).exists()
