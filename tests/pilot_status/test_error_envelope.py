"""Unexpected errors answer the JSON envelope, never an HTML page or a stack trace."""

from __future__ import annotations

import pytest
from django.test import Client


@pytest.fixture
def crash_urls(settings):
    settings.ROOT_URLCONF = "tests.pilot_status.crash_urls"
    settings.DEBUG = False


def test_a_crash_in_an_api_view_is_a_json_500(crash_urls, alice):
    response = alice.client().get("/v1/crash")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert b"secret internals" not in response.content


def test_a_crash_in_a_plain_view_is_a_json_500(crash_urls, db):
    client = Client(raise_request_exception=False)
    response = client.get("/api/internal/crash")
    assert response.status_code == 500
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "internal_error"
    assert b"secret internals" not in response.content


@pytest.mark.parametrize("path", ["/v1/", "/v1/messages/send/extra", "/api/internal/nope"])
def test_unknown_api_paths_are_json_404(db, path):
    response = Client().get(path)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_suspicious_request_on_a_plain_view_is_a_json_400_not_a_500(crash_urls, db, settings):
    # Django raises SuspiciousOperation subclasses (too many fields, a bad host, a bad multipart)
    # for requests the client got wrong; the envelope must say 400, as Django itself would.
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10
    client = Client()
    response = client.post("/api/internal/form", "&".join(f"f{i}=1" for i in range(50)),
                           content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"
