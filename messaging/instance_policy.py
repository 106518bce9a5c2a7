"""Changing an instance's send profile and policy overrides (the API and admin), checked before anything is stored."""

from __future__ import annotations

from typing import Any

from .models import Instance, SendProfile
from .sending import policy
from .sending.policy import PolicyError as PolicyError

FIELDS = {"sendProfile", "sendPolicy"}


def values_of(instance: Instance) -> dict[str, float]:
    """The values in force: an official number's pace is SEND_RATE_PER_INSTANCE unless it has its own."""
    values = policy.values_for(instance.send_profile, instance.send_policy)
    if instance.send_profile == SendProfile.OFFICIAL:
        values["rate_per_second"] = policy.official_rate(instance)
    return values


def update(instance: Instance, body: Any) -> None:
    """Apply `{"sendProfile"?, "sendPolicy"?}` to the instance: `sendPolicy` merges into its overrides (a null value
    drops one), and a new profile keeps only the overrides it knows. PolicyError, and nothing written, when wrong."""
    if not isinstance(body, dict):
        raise PolicyError("body", "The body must be a JSON object.")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise PolicyError(unknown[0], f"Unknown field {unknown[0]!r}: the fields are {', '.join(sorted(FIELDS))}.")
    profile = body.get("sendProfile", instance.send_profile)
    if not isinstance(profile, str):
        raise PolicyError("sendProfile", "sendProfile must be a string.")
    given = body.get("sendPolicy", {})
    if not isinstance(given, dict):
        raise PolicyError("sendPolicy", "sendPolicy must be an object of values to override.")
    known = policy.DEFAULTS.get(profile, {})
    kept = {name: value for name, value in (instance.send_policy or {}).items() if name in known}
    overrides = policy.check_overrides(profile, {**kept, **given})
    Instance.objects.filter(pk=instance.pk).update(send_profile=profile, send_policy=overrides)
    instance.send_profile, instance.send_policy = profile, overrides
