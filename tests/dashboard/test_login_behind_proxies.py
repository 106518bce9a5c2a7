"""Sign-in lockout behind proxies and over IPv6, a per-username bound, and Django's password validators on every
path that sets a password (issue 45 §5).

The client's address is read from X-Forwarded-For only through the proxies TRUSTED_PROXIES names (a count, or
their networks); an IPv6 client is counted by its /64; and a username as a whole may take at most
LOGIN_USERNAME_FAILURE_LIMIT wrong passwords per window, from however many addresses, so that five wrong
passwords from one address behind a proxy lock out that address, never the user everywhere.
"""

from __future__ import annotations

import io
import json

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client, RequestFactory

from dashboard.lockout import address_of
from tests.dashboard.test_login_throttle import RIGHT, fail, sign_in, signed_in

PROXY = "10.0.0.2"  # the reverse proxy's address, as gunicorn sees it


def seen(remote: str, forwarded: str | None = None) -> str | None:
    meta = {"REMOTE_ADDR": remote}
    if forwarded is not None:
        meta["HTTP_X_FORWARDED_FOR"] = forwarded
    return address_of(RequestFactory().post("/dashboard/login/", **meta))


def test_without_trusted_proxies_the_header_is_ignored(settings):
    settings.TRUSTED_PROXY_COUNT, settings.TRUSTED_PROXY_NETWORKS = 0, []
    assert seen(PROXY, "198.51.100.7") == PROXY


def test_a_count_of_proxies_takes_the_address_the_outermost_one_saw(settings):
    settings.TRUSTED_PROXY_COUNT, settings.TRUSTED_PROXY_NETWORKS = 1, []
    assert seen(PROXY, "198.51.100.7") == "198.51.100.7"
    # A client's own X-Forwarded-For comes first; the proxy appends the address it saw.
    assert seen(PROXY, "203.0.113.66, 198.51.100.7") == "198.51.100.7"
    settings.TRUSTED_PROXY_COUNT = 2
    assert seen(PROXY, "203.0.113.66, 198.51.100.7, 10.0.0.9") == "198.51.100.7"
    # Fewer hops than proxies (the inner proxy reached directly): the header proves nothing.
    assert seen(PROXY, "198.51.100.7") == PROXY


def test_trusted_networks_are_skipped_from_the_right(settings):
    settings.TRUSTED_PROXY_COUNT, settings.TRUSTED_PROXY_NETWORKS = 0, ["10.0.0.0/8", "fd00::/8"]
    assert seen(PROXY, "203.0.113.66, 198.51.100.7, 10.1.1.1") == "198.51.100.7"
    # A peer that is no trusted proxy is the client, whatever it claims.
    assert seen("198.51.100.9", "203.0.113.66") == "198.51.100.9"
    assert seen(PROXY, "garbage, 198.51.100.7") == "198.51.100.7"
    assert seen(PROXY, "198.51.100.7, garbage") == PROXY  # a hop our proxy never writes: the proxy itself


def test_ipv6_is_counted_by_its_64(settings):
    settings.TRUSTED_PROXY_COUNT, settings.TRUSTED_PROXY_NETWORKS = 0, []
    assert seen("2001:db8:1:2::1") == seen("2001:db8:1:2:ffff:ffff:ffff:fffe") == "2001:db8:1:2::"
    assert seen("2001:db8:1:3::1") == "2001:db8:1:3::"
    assert seen("::ffff:198.51.100.7") == "198.51.100.7"  # an IPv4 client on a dual-stack socket
    assert seen("198.51.100.7") == "198.51.100.7"


def test_behind_a_proxy_five_wrong_passwords_lock_out_their_address_only(bob, settings):
    settings.TRUSTED_PROXY_COUNT = 1
    attacker = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="203.0.113.66")
    fail(attacker, settings.LOGIN_FAILURE_LIMIT)
    assert sign_in(attacker, RIGHT) == 429
    # bob, through the same proxy from his own address, signs in.
    owner = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="198.51.100.20")
    assert sign_in(owner, RIGHT) == 302 and signed_in(owner)


def test_one_64_is_one_address(bob):
    fail(Client(REMOTE_ADDR="2001:db8:1:2::1"), settings.LOGIN_FAILURE_LIMIT)
    neighbour = Client(REMOTE_ADDR="2001:db8:1:2::beef")
    assert sign_in(neighbour, RIGHT) == 429 and not signed_in(neighbour)
    assert sign_in(Client(REMOTE_ADDR="2001:db8:1:3::1"), RIGHT) == 302


def test_a_username_takes_a_bounded_number_of_guesses_from_every_address_together(bob, settings):
    settings.LOGIN_USERNAME_FAILURE_LIMIT = 12
    addresses = [f"198.51.100.{n}" for n in range(1, 5)]
    for address in addresses[:3]:  # 3 × 4 = 12 wrong passwords, each address under its own limit
        for _ in range(4):
            assert sign_in(Client(REMOTE_ADDR=address), "wrong-password") in (200, 429)
    late = Client(REMOTE_ADDR=addresses[3])
    assert sign_in(late, RIGHT) == 429 and not signed_in(late)


def test_under_the_username_bound_another_address_signs_in(bob, settings):
    settings.LOGIN_USERNAME_FAILURE_LIMIT = 12
    for address in ("198.51.100.1", "198.51.100.2", "198.51.100.3"):
        for _ in range(3):
            assert sign_in(Client(REMOTE_ADDR=address), "wrong-password") == 200
    assert sign_in(Client(REMOTE_ADDR="198.51.100.4"), RIGHT) == 302


def test_the_username_bound_is_far_above_the_pairs():
    assert settings.LOGIN_USERNAME_FAILURE_LIMIT >= 10 * settings.LOGIN_FAILURE_LIMIT


# --- passwords ----------------------------------------------------------------------------------


def create_member(*args: str) -> tuple[dict, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("create_member", *args, stdout=out, stderr=err)
    return json.loads(out.getvalue()), err.getvalue()


@pytest.mark.parametrize("password", ["password123", "12345678901", "short", "qwertyuiop"])
def test_create_member_refuses_a_weak_password_with_a_json_error(alice, password, capsys):
    with pytest.raises(CommandError) as refused:
        create_member("--project", str(alice.project.pk), "--username", "dave", "--password", password)
    error = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert "password" in error["error"].lower()
    assert "password" in str(refused.value).lower()
    assert not get_user_model().objects.filter(username="dave").exists()


def test_a_reset_password_is_validated_too(alice, bob):
    with pytest.raises(CommandError):
        create_member("--project", str(alice.project.pk), "--username", "bob", "--password", "password",
                      "--reset-password")
    assert get_user_model().objects.get(username="bob").check_password(RIGHT)


def test_a_strong_password_makes_the_member(alice):
    made, _ = create_member("--project", str(alice.project.pk), "--username", "dave", "--password",
                            "correct horse battery staple")
    assert get_user_model().objects.get(pk=made["user_id"]).check_password("correct horse battery staple")


def test_every_django_validator_is_on():
    names = {v["NAME"].rsplit(".", 1)[-1] for v in settings.AUTH_PASSWORD_VALIDATORS}
    assert names >= {"UserAttributeSimilarityValidator", "MinimumLengthValidator", "CommonPasswordValidator",
                     "NumericPasswordValidator"}


def test_the_admin_refuses_a_weak_password(admin_client):
    response = admin_client.post("/admin/auth/user/add/", {
        "username": "erin", "password1": "password", "password2": "password", "usable_password": "true",
    })
    assert response.status_code == 200  # the form again, with its error
    assert not get_user_model().objects.filter(username="erin").exists()
