"""Every /v1 endpoint, called by carol with alice's ids, answers 404 and changes nothing.

The routes are read from the URLconf, so a new endpoint is covered the day it is added (and a
new kind of path parameter fails here until it is given an object of alice's).
"""

from __future__ import annotations

import re
from datetime import timedelta

from django.urls import URLPattern
from django.utils import timezone

from messaging import opt_ins
from messaging.api import urls as api_urls
from messaging.models import DeadLetter, Instance, Message, OptIn

METHODS = ("get", "post", "put", "patch", "delete")


def alice_objects(alice, alice_instance):
    message = Message.objects.create(
        project=alice.project, environment="LIVE", category="UTILITY", to="+5511988887777", template="hi",
        text="hi", instance=alice_instance, deliver_until=timezone.now() + timedelta(hours=1), status="FAILED",
        failure_reason="INVALID_RECIPIENT",
    )
    dead = DeadLetter.objects.create(message=message, project=alice.project, reason="INVALID_RECIPIENT")
    opt_ins.record(alice.project, "+5511988887777", "form")
    return {"message_id": str(message.pk), "phone": "+5511988887777", "pk": str(dead.pk), "id": str(dead.pk),
            "dead_letter_id": str(dead.pk), "name": alice_instance.name}


def snapshot():
    return (
        list(Message.objects.values_list("pk", "status", "attempts")),
        list(DeadLetter.objects.values_list("pk", "status")),
        list(OptIn.objects.values_list("pk", "revoked_at")),
        list(Instance.objects.values_list("pk", "send_profile", "send_policy", "health_state")),
    )


def test_carol_gets_404_on_every_route_with_alices_ids(alice, alice_instance, carol):
    ids = alice_objects(alice, alice_instance)
    before = snapshot()
    client = carol.client()
    checked = 0
    for pattern in api_urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        params = list(pattern.pattern.converters)
        if not params:
            continue
        missing = [p for p in params if p not in ids]
        assert not missing, f"no alice object for path parameter(s) {missing} of {pattern.pattern}"
        path = "/v1/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: ids[m.group(1)], str(pattern.pattern))
        assert "<" not in path
        view = pattern.callback.view_class
        for method in METHODS:
            if not hasattr(view, method):
                continue
            response = getattr(client, method)(path, {}, format="json")
            # the same call by alice must not be a 404: it proves the route was really hit
            own = getattr(alice.client(), method)
            if method == "get":
                assert own(path).status_code == 200, path
            assert response.status_code == 404, f"{method.upper()} {path} → {response.status_code}"
            assert response.json()["error"]["code"] == "not_found"
            checked += 1
    assert checked >= 2
    assert snapshot() == before
