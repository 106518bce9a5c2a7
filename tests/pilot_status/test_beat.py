"""Maintenance that cannot stall (issue 22): beat's entries expire for real, and the real `celery beat`
(DatabaseScheduler) with the maintenance workers runs every scheduled job, each on its own queue."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.utils import timezone

from pilot_status import heartbeats
from pilot_status.celery import BULK_QUEUE, MAINTENANCE_QUEUE, SYNC_QUEUE, app
from tests.support.simulator import wait_until


def test_the_database_scheduler_keeps_every_entrys_expiry(transactional_db: Any) -> None:
    from django_celery_beat.models import PeriodicTask
    from django_celery_beat.schedulers import DatabaseScheduler

    scheduler = DatabaseScheduler(app=app)  # writes app.conf.beat_schedule into PeriodicTask rows
    for name, entry in app.conf.beat_schedule.items():
        row = PeriodicTask.objects.get(name=name)
        period = entry["schedule"]
        assert row.expires_ == max(1, int(period)), name  # what the scheduler sends as `expires`
        assert row.queue == entry["options"]["queue"]
        assert scheduler.schedule[name].options["expires"] == row.expires_


def test_each_kind_of_maintenance_has_its_own_queue() -> None:
    routes = app.conf.task_routes
    assert routes["messaging.reconcile_messages"]["queue"] == MAINTENANCE_QUEUE
    assert routes["messaging.sync_statuses"]["queue"] == SYNC_QUEUE
    assert routes["dashboard.run_bulk_resend"]["queue"] == BULK_QUEUE
    assert len({MAINTENANCE_QUEUE, SYNC_QUEUE, BULK_QUEUE}) == 3


FAST = {
    "RECONCILE_SECONDS": "1",
    "STATUS_SYNC_SECONDS": "1",
    "INSTANCE_POLL_SECONDS": "1",
    "INGESTION_RECONCILE_SECONDS": "2",
    "RETENTION_SECONDS": "2",
    "HEALTH_PASS_SECONDS": "1",
}


def test_beat_and_the_maintenance_workers_run_every_scheduled_job(
    stack: Any, simulator: Any, alice: Any, alice_instance: Any
) -> None:
    from messaging.models import Message, OutboxEntry
    from tests.messaging.sending_helpers import open_on_simulator, queue

    # Something for the reconciler to find: a send whose worker died (lease long expired).
    [message_id] = queue(alice, "UTILITY", 1)
    Message.objects.filter(pk=message_id).update(
        status="SENDING", lease_expires_at=timezone.now() - timedelta(minutes=1), next_attempt_at=timezone.now() + timedelta(hours=1)
    )
    # And a slow Evolution for status sync: 20 stale messages, 1.5 s per lookup, a 3 s budget per pass. The running
    # stack must not send them first (the simulator's receipts would move them on to READ, leaving the sync nothing):
    # its relay is stopped while they are written, and they leave the outbox.
    open_on_simulator(simulator, alice_instance, latency_ms=1500)
    relay = stack.processes["relay"]
    relay.stop()
    try:
        stale = queue(alice, "UTILITY", 20)
        OutboxEntry.objects.filter(message_id__in=stale).delete()
        for n, pk in enumerate(stale):  # each its own WhatsApp id: one id belongs to one message (msg_evolution_id_once)
            Message.objects.filter(pk=pk).update(
                status="SENT", evolution_message_id=f"3EB0SLOWLOOKUP{n:02d}", sent_at=timezone.now() - timedelta(hours=1)
            )
    finally:
        relay.start()
    # Heartbeats live in Redis: an earlier test's passes may still be there. Only this test's count.
    started_at = time.time()
    stack.start_maintenance({**FAST, "STATUS_SYNC_PASS_SECONDS": "3"})
    try:
        tasks = {entry["task"] for entry in app.conf.beat_schedule.values()}
        deadline = time.monotonic() + 90
        seen: dict[str, Any] = {}
        reconciles_during_sync: set[float] = set()
        sync_passes: dict[float, float] = {}  # end → seconds
        while time.monotonic() < deadline:
            seen = {task: beat for task, beat in heartbeats.read().items() if beat["at"] >= started_at}
            if "messaging.reconcile_messages" in seen and "messaging.sync_statuses" not in seen:
                reconciles_during_sync.add(seen["messaging.reconcile_messages"]["at"])
            if "messaging.sync_statuses" in seen:
                sync_passes[seen["messaging.sync_statuses"]["at"]] = seen["messaging.sync_statuses"]["seconds"]
            if tasks <= set(seen) and all(seen[t]["state"] == "SUCCESS" for t in tasks):
                break
            time.sleep(0.2)
        beat_log = stack.processes["beat"].log.read_text()[-3000:]
        assert tasks <= set(seen), f"never ran: {sorted(tasks - set(seen))}; beat log:\n{beat_log}"
        assert {t: seen[t]["state"] for t in tasks} == {t: "SUCCESS" for t in tasks}
        # Each on its queue's own worker.
        assert seen["messaging.reconcile_messages"]["worker"] == "maintenance@test"
        assert seen["messaging.prune_timelines"]["worker"] == "maintenance@test"
        assert seen["ingestion.prune_inbox"]["worker"] == "maintenance@test"
        assert seen["messaging.govern_health"]["worker"] == "maintenance@test"
        assert seen["messaging.sync_statuses"]["worker"] == "sync@test"
        assert seen["messaging.poll_instance_states"]["worker"] == "sync@test"
        assert seen["ingestion.reconcile_events"]["worker"] == "sync@test"
        # The slow status sync used its budget and kept to it: a pass stops at the first lookup that
        # ends past it, so it makes at most 3 s / 1.5 s + 1 lookups, however slow the machine (each
        # message's last check is stamped in the pass that made it). And the reconciler ran again and
        # again meanwhile instead of waiting behind it.
        assert sync_passes[min(sync_passes)] >= 3, sync_passes
        checked = [at.timestamp() for at in Message.objects.filter(pk__in=stale, status_checked_at__isnull=False)
                   .values_list("status_checked_at", flat=True)]
        ends = sorted(sync_passes)
        per_pass = [sum(since < at <= end for at in checked) for since, end in zip([0.0, *ends], ends)]
        assert per_pass[0] >= 1 and max(per_pass) <= int(3 / 1.5) + 1, (per_pass, sync_passes)
        assert len(reconciles_during_sync) >= 2
        # Operators see the same in the metrics.
        from django.conf import settings
        from django.test import Client

        body = Client().get("/api/internal/metrics", HTTP_X_INTERNAL_WEBHOOK_SECRET=settings.INTERNAL_WEBHOOK_SECRET).json()
        assert tasks <= set(body["maintenance"])
        # And the reconciler's pass did its job (then the stack's relay and workers sent it). The send it
        # released is claimed again (SENDING) for the simulator's 1.5 s answer, so the test waits for the
        # answer rather than catching the message inside that second send.
        assert Message.objects.get(pk=message_id).events.filter(kind="RECOVERED").exists()
        wait_until(
            lambda: Message.objects.get(pk=message_id).status != "SENDING",
            timeout=60,
            message="the recovered message was sent again",
        )
    finally:
        stack.stop_maintenance()
