"""Sign-in throttling (issue 21): after LOGIN_FAILURE_LIMIT wrong passwords for one username from one address,
even the right password is refused for LOGIN_LOCKOUT_SECONDS; a good sign-in starts the count again."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

LOGIN = "/dashboard/login/"
RIGHT = "bob-password-123"  # tests/conftest.py's bob


def sign_in(client: Client, password: str, username: str = "bob", url: str = LOGIN) -> int:
    return client.post(url, {"username": username, "password": password}).status_code


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def fail(client: Client, times: int, username: str = "bob", url: str = LOGIN) -> None:
    for n in range(1, times + 1):
        # The form again, with its error; the failure that reaches the limit already gets the lockout page.
        expected = 429 if n == settings.LOGIN_FAILURE_LIMIT else 200
        assert sign_in(client, "wrong-password", username, url) == expected, n


def test_the_defaults_are_documented_values():
    assert settings.LOGIN_FAILURE_LIMIT == 5
    assert settings.LOGIN_LOCKOUT_SECONDS == 900


def test_after_the_limit_even_the_right_password_is_refused_for_the_window(bob):
    client = Client()
    fail(client, settings.LOGIN_FAILURE_LIMIT)

    response = client.post(LOGIN, {"username": "bob", "password": RIGHT})

    assert response.status_code == 429
    assert b"Too many failed sign-ins" in response.content
    assert not signed_in(client)
    with time_machine.travel(timezone.now() + timedelta(seconds=settings.LOGIN_LOCKOUT_SECONDS - 60)):
        assert sign_in(client, RIGHT) == 429 and not signed_in(client)
    with time_machine.travel(timezone.now() + timedelta(seconds=settings.LOGIN_LOCKOUT_SECONDS + 1)):
        assert sign_in(client, RIGHT) == 302 and signed_in(client)


def test_one_failure_short_of_the_limit_the_right_password_still_works(bob):
    client = Client()
    fail(client, settings.LOGIN_FAILURE_LIMIT - 1)
    assert sign_in(client, RIGHT) == 302 and signed_in(client)


def test_a_good_sign_in_resets_the_count(bob):
    client = Client()
    fail(client, settings.LOGIN_FAILURE_LIMIT - 1)
    assert sign_in(client, RIGHT) == 302
    client.post("/dashboard/logout/")

    fail(client, settings.LOGIN_FAILURE_LIMIT - 1)  # without the reset this would pass the limit

    assert sign_in(client, RIGHT) == 302 and signed_in(client)


def test_the_lockout_is_per_username_and_address(bob):
    from messaging.models import Project

    get_user_model().objects.create_user("ana", password="ana-password-123").projects.add(Project.objects.get())
    attacker = Client(REMOTE_ADDR="203.0.113.7")
    fail(attacker, settings.LOGIN_FAILURE_LIMIT)
    assert sign_in(attacker, RIGHT) == 429

    # bob from his own address, and another user from the attacker's, are not locked out.
    assert sign_in(Client(REMOTE_ADDR="198.51.100.20"), RIGHT) == 302
    assert sign_in(attacker, "ana-password-123", username="ana") == 302


def test_the_admin_sign_in_is_throttled_too(db):
    get_user_model().objects.create_superuser("ops", "ops@example.com", "ops-password-123")
    client = Client()
    fail(client, settings.LOGIN_FAILURE_LIMIT, username="ops", url="/admin/login/")
    assert sign_in(client, "ops-password-123", username="ops", url="/admin/login/") == 429
    assert not signed_in(client)


@pytest.mark.parametrize("username", ["bob\x00", "b" * 5000, ""])
def test_malformed_usernames_are_a_form_error(bob, username):
    assert sign_in(Client(), "whatever", username=username) == 200


@pytest.mark.parametrize("header,value", [
    ("HTTP_USER_AGENT", "x" * 5000), ("HTTP_USER_AGENT", "\x00"), ("HTTP_USER_AGENT", "ação"),
    ("HTTP_ACCEPT", "y" * 5000), ("REMOTE_ADDR", "not-an-address"),
])
def test_odd_headers_on_a_failed_sign_in_are_no_server_error(bob, header, value):
    client = Client(raise_request_exception=False, **{header: value})
    assert sign_in(client, "wrong-password") == 200
    assert sign_in(client, RIGHT) == 302
