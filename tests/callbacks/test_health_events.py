"""`instance.health` (issue 47 §3): an endpoint that asks for it gets one delivery per change of the health state of
one of its project's instances (messaging.governor's InstanceHealthEvent rows), LIVE endpoints only; the API
accepts it as an event type."""

from __future__ import annotations

import pytest

from callbacks import derive
from callbacks.models import Delivery, WebhookEndpoint
from messaging import governor
from messaging.models import Instance
from tests.callbacks.test_api import create
from tests.conftest import add_instance

# transaction: the derive pass's two-step cursor waits for the transactions it saw in flight to finish.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.serial]


def logout(instance: Instance) -> None:
    instance.refresh_from_db()
    governor.connection(instance, "close", 401, instance.set_connection_state("close"))


def test_each_change_owes_one_delivery_to_the_endpoints_that_ask(alice, carol, alice_instance):
    asks = WebhookEndpoint.objects.create(project=alice.project, url="http://127.0.0.1:9/hook",
                                          event_types=["instance.health"])
    status_only = WebhookEndpoint.objects.create(project=alice.project, url="http://127.0.0.1:9/other",
                                                 event_types=["message.status"])
    sandbox = WebhookEndpoint.objects.create(project=alice.project, url="http://127.0.0.1:9/test",
                                             event_types=["instance.health"], environment="TEST")
    carols = WebhookEndpoint.objects.create(project=carol.project, url="http://127.0.0.1:9/c",
                                            event_types=["instance.health"])
    logout(alice_instance)  # resting
    governor.override(Instance.objects.get(pk=alice_instance.pk), "healthy", "ops")

    derive.run()
    derive.run()  # a second pass owes nothing more

    deliveries = sorted(Delivery.objects.filter(endpoint=asks), key=lambda d: d.payload["data"]["sequence"])
    assert [d.source for d in deliveries] == [f"health:{d.payload['data']['sequence']}" for d in deliveries]
    assert [d.payload["data"]["state"] for d in deliveries] == ["resting", "healthy"]
    first, second = (d.payload for d in deliveries)
    assert first["type"] == "instance.health" and all(d.event_type == "instance.health" for d in deliveries)
    assert first["data"]["instance"] == "alice-main" and first["data"]["previousState"] == "healthy"
    assert (first["data"]["reason"], first["data"]["by"]) == ("logout", "governor")
    assert first["data"]["evidence"]["loggedOutAt"] and first["data"]["changedAt"]
    assert (second["data"]["reason"], second["data"]["by"]) == ("operator", "operator")
    assert "ops" not in str(second)  # the operator's name stays in admin
    assert second["data"]["sequence"] > first["data"]["sequence"]
    assert not Delivery.objects.filter(endpoint__in=[status_only, sandbox, carols]).exists()


def test_a_shared_numbers_health_owes_no_project_a_delivery(alice):
    WebhookEndpoint.objects.create(project=alice.project, url="http://127.0.0.1:9/hook",
                                   event_types=["instance.health"])
    logout(add_instance(None, "pilot-shared", priority=5))
    derive.run()
    assert not Delivery.objects.exists()


def test_changes_before_any_endpoint_asked_owe_nothing(alice, alice_instance):
    logout(alice_instance)
    derive.run()  # no endpoint asks: the cursor moves past it
    WebhookEndpoint.objects.create(project=alice.project, url="http://127.0.0.1:9/hook",
                                   event_types=["instance.health"])
    derive.run()
    assert not Delivery.objects.exists()


def test_the_api_accepts_the_event_type(alice, settings):
    answer = create(alice, eventTypes=["instance.health", "message.status"])
    assert answer.status_code == 201, answer.content
    assert answer.json()["eventTypes"] == ["instance.health", "message.status"]
