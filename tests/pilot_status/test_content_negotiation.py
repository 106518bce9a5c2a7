"""ClientApiView's short way through content negotiation gives DRF's answer (bench B1).

For the Accept headers almost every client sends (none, */*, application/json) the view skips
DRF's negotiation; every other header, a ?format= and a view without format_kwarg (the key
failed before initial()) must end exactly as DRF's negotiation would.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.http import Http404
from django.test import RequestFactory
from rest_framework import exceptions
from rest_framework.views import APIView

from messaging.api.views import SendMessageView

ACCEPTS = [None, "*/*", "application/json", "application/json; indent=4", "application/*", "*/*;q=0.8",
           "text/html", "text/html, */*", "application/xml", "APPLICATION/JSON", ""]


def _view(accept: str | None, query: str = "", format_kwarg: bool = True) -> tuple[SendMessageView, Any]:
    headers = {"HTTP_ACCEPT": accept} if accept is not None else {}
    django_request = RequestFactory().post("/v1/messages/send" + query, **headers)
    view = SendMessageView()
    view.args, view.kwargs, view.headers = (), {}, {}
    request = view.initialize_request(django_request)
    view.request = request
    if format_kwarg:
        view.format_kwarg = view.get_format_suffix()
    return view, request


def _outcome(negotiate: Any, *args: Any) -> Any:
    try:
        renderer, media_type = negotiate(*args)
    except (exceptions.APIException, Http404) as exc:
        return type(exc)
    return type(renderer), media_type


@pytest.mark.parametrize("query", ["", "?format=json", "?format=html", "?x=1"])
@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize("force", [False, True])
def test_negotiation_answers_as_drf_does(accept, query, force):
    view, request = _view(accept, query)
    ours = _outcome(view.perform_content_negotiation, request, force)
    drf = _outcome(lambda r, f: APIView.perform_content_negotiation(view, r, f), request, force)
    assert ours == drf


@pytest.mark.parametrize("accept", ACCEPTS)
def test_negotiation_before_initial_answers_as_drf_does(accept):
    view, request = _view(accept, format_kwarg=False)
    ours = _outcome(view.perform_content_negotiation, request, True)
    drf = _outcome(lambda r, f: APIView.perform_content_negotiation(view, r, f), request, True)
    assert ours == drf


@pytest.mark.parametrize("accept", [None, "*/*", "application/json"])
def test_the_usual_accept_headers_skip_drfs_negotiation(accept, monkeypatch):
    view, request = _view(accept)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("DRF's negotiation used for a plain Accept header")

    monkeypatch.setattr(APIView, "perform_content_negotiation", refuse)
    renderer, media_type = view.perform_content_negotiation(request)
    assert (renderer.media_type, media_type) == ("application/json", "application/json")
