"""GET /v1/instances and PATCH /v1/instances/{name}: the project's numbers, their states and send policies."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response

from pilot_status.api import ClientApiView

from .. import instance_policy
from ..errors import Rejected
from ..models import Environment, Instance
from ..representations import iso
from . import schema


def instance_body(instance: Instance) -> dict[str, Any]:
    return {
        "name": instance.name,
        "state": instance.connection_state,
        "priority": instance.priority,
        "stateChangedAt": iso(instance.state_changed_at),
        "sendProfile": instance.send_profile,
        # The values in force (the profile's defaults with this number's overrides), and the overrides alone.
        "sendPolicy": instance_policy.values_of(instance),
        "sendPolicyOverrides": instance.send_policy or {},
        "healthState": instance.health_state,
        # The health governor's last change of the state, and the end of a cooling period (no cold contacts until
        # then; docs/sending-policy.md, "Health governor").
        "healthChangedAt": iso(instance.health_changed_at),
        "coldContactsPausedUntil": iso(instance.cold_paused_until),
    }


class InstanceListView(ClientApiView):
    @extend_schema(
        operation_id="list_instances",
        summary="The project's WhatsApp instances, their connection states and send policies.",
        responses=schema.responses(200, schema.InstanceList, 401, 429),
    )
    def get(self, request: Request) -> Response:
        rows = Instance.objects.filter(project=self.project).order_by("priority", "pk")
        return Response({"data": [instance_body(i) for i in rows]})


class InstanceDetailView(ClientApiView):
    @extend_schema(
        operation_id="update_instance",
        summary="Set one of the project's instances' send profile and override its policy's values "
        "(docs/sending-policy.md); a null value drops an override. LIVE keys only: a TEST key gets 404.",
        request=schema.InstanceUpdate,
        responses=schema.responses(200, schema.Instance, 400, 401, 404, 415, 429),
    )
    def patch(self, request: Request, name: str) -> Response:
        # An instance sends LIVE messages: a TEST key never changes it (the sandbox rule, docs/security.md).
        instance = None
        if self.environment == Environment.LIVE:
            instance = Instance.objects.filter(project=self.project, name=name).first()
        if instance is None:
            raise exceptions.NotFound()
        try:
            instance_policy.update(instance, request.data)
        except instance_policy.PolicyError as exc:
            raise Rejected(400, "invalid_request", str(exc), {"fields": {exc.field: [str(exc)]}}) from exc
        return Response(instance_body(instance))
