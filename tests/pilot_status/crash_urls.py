"""A URLconf for tests only: endpoints that crash, to check the error envelope of a real 500."""

from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from rest_framework.request import Request
from rest_framework.response import Response

from pilot_status.api import ClientApiView


class CrashingApiView(ClientApiView):
    def get(self, request: Request) -> Response:
        raise RuntimeError("secret internals that must not leak")


def crashing_plain_view(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("secret internals that must not leak")


def form_reading_view(request: HttpRequest) -> HttpResponse:
    # Reading request.POST raises TooManyFieldsSent (a SuspiciousOperation) past the field limit.
    return HttpResponse(str(len(request.POST)))


urlpatterns = [
    path("api/internal/form", form_reading_view),
    path("v1/crash", CrashingApiView.as_view()),
    path("api/internal/crash", crashing_plain_view),
    path("", include("pilot_status.urls")),
]
