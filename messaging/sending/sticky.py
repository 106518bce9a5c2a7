"""The sticky sender (docs/sending-policy.md): a recipient hears from the project's number they last talked with.

To a recipient, a message from a number they never exchanged a message with is a stranger's: cold outreach, the
commonest cause of bans. So before an unofficial number sends, the worker looks at the numbers this message may go
through (its own, then the fallbacks the contract allows it: `rules.fallback_instances`):
1. the one that last exchanged with the recipient (either way) sends, if it can now;
2. if none of them knows the recipient, its own number sends while it has cold contacts left today; otherwise an
   official number, or an unofficial one with cold contacts left;
3. otherwise it stays on its own number, where the policy holds it (the cold-contact quota) until a number may reach
   the recipient, or fails it `NO_WARM_INSTANCE` when none may before its deliverUntil (messaging.sending.turns).
A message whose client named its instance is never moved, nor one on an official number (Meta's rules have no cold
contacts to spare). A move is a REROUTED line, as any re-route.
"""

from __future__ import annotations

import uuid

from django.utils import timezone

from .. import exchanges, governor, health, rules
from ..models import Instance, Message, SendProfile
from . import policy, routing, slots

STICKY = "sticky sender"
NO_COLD_QUOTA = "no cold contacts left on its number"


def cold_quota_left(instance: Instance) -> bool:
    if health.sends_nothing(instance.health_state):
        return False
    if instance.send_profile == SendProfile.OFFICIAL:
        return True
    now = timezone.now()
    schedule = slots.standings([instance.pk], now)[instance.pk].schedule
    values = policy.values_for(SendProfile.UNOFFICIAL, instance.send_policy)
    terms = governor.policy_terms(instance.health_state, instance.cold_paused_until)
    return policy.cold_quota_left(values, schedule, now, slots.scale(), terms["cap_factor"],
                                  terms["cold_paused_until"])


def choose(message: Message, token: uuid.UUID, route: routing.Route) -> routing.Route:
    current = route.instance
    if message.requested_instance or current.send_profile != SendProfile.UNOFFICIAL:
        return route
    opted_in = rules.has_live_opt_in(message.project, message.environment, message.to)
    others = rules.fallback_instances(message.project, message.category, opted_in, exclude=[current.pk])
    by_id = {instance.pk: instance for instance in others}
    for known in exchanges.known_by([current.pk, *by_id], message.to):
        if known == current.pk:
            return route
        target = by_id[known]
        if health.sends_nothing(target.health_state):
            continue  # a resting or restricted number sends nothing: another that knows the recipient may
        if routing.usable(target)[0] and routing.reroute(message, token, target, STICKY):
            return routing.Route(target)
    if cold_quota_left(current):
        return route
    for target in others:
        if cold_quota_left(target) and routing.usable(target)[0] and routing.reroute(message, token, target, NO_COLD_QUOTA):
            return routing.Route(target)
    return route
