"""The bulk accept path: create a backlog fast when a scenario is about draining, not accepting.

It runs the real funnel checks (`messaging.accept.check_funnel`) once per recipient, then writes per
message exactly the rows `messaging.accept.accept_message` writes — the QUEUED message, its ACCEPTED
event and its outbox entry — in batched multi-row INSERTs inside one transaction, and NOTIFYs the
relay once per lane at commit. tests/bench/test_bench_smoke.py checks that a bulk row and an accepted
row agree field by field, so this cannot drift silently from the product.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from messaging import rules
from messaging.accept import SendRequest, check_funnel
from messaging.inserts import notify_relay
from messaging.models import ApiKey, Category, EventKind, Message, MessageEvent, OutboxEntry, Priority

BATCH = 2_000


def live_key(project: Any) -> ApiKey:
    key = project.api_keys.filter(environment="LIVE", revoked_at__isnull=True).order_by("-pk").first()
    assert key is not None, f"{project} has no live key"
    return key


def bulk_accept(
    project: Any,
    api_key: ApiKey,
    recipients: list[str],
    count: int,
    category: str,
    text: str = "Bench {{n}}",
    now: datetime | None = None,
    enqueue: bool = True,
    instances: list[str] | None = None,
    longest_ttl: bool = False,
) -> list[str]:
    """Accept `count` messages (recipients round-robin); returns their ids in creation order.

    enqueue=False writes the messages without outbox entries (B5 needs SENT messages, not sends).
    instances: explicit instance names (round-robin, as a client's `instance` field would ask);
    without them the funnel chooses, as it does for a request without `instance`.
    longest_ttl: deliverUntil at the longest a client may ask for (rules.MAX_TTL) instead of the
    category's default, for a figure that counts sends, not expiries.
    """
    requests = {to: SendRequest(to=to, category=category, template=text, variables={"n": "0"}) for to in recipients}
    chosen = {to: check_funnel(project, api_key.environment, req) for to, req in requests.items()}
    # Opt-in is per recipient and ownership per instance: checking each once covers every pair.
    explicit = [
        check_funnel(project, api_key.environment, SendRequest(recipients[0], category, text, {"n": "0"}, name))
        for name in instances or []
    ]
    now = now or timezone.now()
    deliver_until = now + rules.MAX_TTL[Category(category)] if longest_ttl else rules.deliver_until_for(category, now)
    ids: list[str] = []
    with transaction.atomic():
        for start in range(0, count, BATCH):
            messages = []
            for i in range(start, min(count, start + BATCH)):
                to = recipients[i % len(recipients)]
                req = requests[to]
                variables = {"n": str(i)}
                messages.append(
                    Message(
                        project=project,
                        api_key=api_key,
                        environment=api_key.environment,
                        category=category,
                        priority=Priority.NORMAL,
                        to=to,
                        template=req.template,
                        variables=variables,
                        text=rules.render(req.template, variables),
                        metadata={},
                        instance=explicit[i % len(explicit)] if explicit else chosen[to],
                        requested_instance=explicit[i % len(explicit)].name if explicit else "",
                        deliver_until=deliver_until,
                        next_attempt_at=now,
                        max_attempts=settings.SEND_MAX_ATTEMPTS,
                        created_at=now,
                    )
                )
            Message.objects.bulk_create(messages)
            MessageEvent.objects.bulk_create(
                [
                    MessageEvent(
                        message=m, kind=EventKind.ACCEPTED, actor=api_key.display_prefix,
                        detail={"instance": m.instance.name}, created_at=now,
                    )
                    for m in messages
                ]
            )
            if enqueue:
                OutboxEntry.objects.bulk_create(
                    [
                        OutboxEntry(message=m, project_id_copy=project.pk, lane=m.lane, priority=0, available_at=now,
                                    created_at=now)
                        for m in messages
                    ]
                )
            ids.extend(str(m.pk) for m in messages)
        if enqueue:
            notify_relay(category.lower())
    return ids
