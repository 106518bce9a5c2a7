"""The baseline of B1 and B5: a bare DRF view that inserts one row, on the same server and settings."""

from __future__ import annotations

from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .models import BaselineRow


class BareInsertView(APIView):
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    throttle_classes: list[type] = []

    def post(self, request: Request) -> Response:
        row = BaselineRow.objects.create(payload=request.data)
        return Response({"id": row.pk}, status=status.HTTP_201_CREATED)
