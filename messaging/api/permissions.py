from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..models import ApiKey


class HasProject(BasePermission):
    """Every client endpoint acts for the project of the API key, never one named in the body."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, ApiKey)
