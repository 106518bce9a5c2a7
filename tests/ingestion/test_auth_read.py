"""The webhook's read of an instance's credentials: one fixed statement, and a small value that checks
tokens exactly as Instance does (ingestion.auth)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jwt
import pytest
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from ingestion import auth
from messaging.models import Instance
from tests.ingestion.helpers import URL, receipt, token_header


def authenticate(**headers: str) -> auth.InstanceCredentials | None:
    request = RequestFactory().post(URL, **headers)
    return auth.authenticate_evolution(request, receipt("DELIVERY_ACK"))


def test_a_cache_miss_reads_only_the_credentials_in_one_statement(alice_instance):
    sent: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)  # as given: a prepared statement's captured "sql" is None
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(record):
        credentials = authenticate(**token_header(alice_instance))

    assert credentials == auth.InstanceCredentials(
        alice_instance.pk, "alice-main", alice_instance.token_salt, alice_instance.evolution_token_hash)
    assert len(queries.captured_queries) == 1 and len(sent) == 1, (queries.captured_queries, sent)
    sql = " ".join(sent[0].split())
    selected = re.fullmatch(r"SELECT (.+) FROM messaging_instance WHERE name = %s", sql)
    assert selected is not None, sql
    assert selected.group(1).split(", ") == ["id", "name", "token_salt", "evolution_token_hash"]
    assert "ORDER BY" not in sql.upper()


def test_what_is_cached_is_the_credentials_not_a_model(alice_instance):
    assert authenticate(**token_header(alice_instance)) is not None

    cached = auth._known.get("alice-main", auth.AUTH_CACHE_SECONDS)
    assert cached is not None and type(cached[0]) is auth.InstanceCredentials
    with pytest.raises(dataclasses.FrozenInstanceError):
        cached[0].token_salt = "changed"  # type: ignore[misc]


def test_a_wrong_token_against_the_cached_copy_is_checked_once_more_against_a_fresh_read(alice_instance):
    assert authenticate(**token_header(alice_instance)) is not None  # cached now

    with CaptureQueriesContext(connection) as queries:
        assert authenticate(**token_header(alice_instance)) is not None
    assert queries.captured_queries == []  # the cached copy proves it

    with CaptureQueriesContext(connection) as queries:
        assert authenticate(HTTP_X_WEBHOOK_TOKEN="not-the-token") is None
    assert len(queries.captured_queries) == 1  # refused by the copy: the database decides

    # and the fresh read replaced the copy: a token made since (a re-key) proves it at once
    Instance.objects.filter(pk=alice_instance.pk).update(token_salt="re-keyed")
    re_keyed = token_header(Instance.objects.get(pk=alice_instance.pk))
    with CaptureQueriesContext(connection) as queries:
        assert authenticate(**re_keyed) is not None
    assert len(queries.captured_queries) == 1


CANDIDATES = ["TOKEN-ALICE-MAIN", "token-alice-main", "", "x" * 600, "caf\u00e9", "\udc80", "TOKEN-ALICE-MAIN\x00"]


@pytest.mark.parametrize("candidate", CANDIDATES + ["webhook token"])
def test_the_credentials_check_tokens_as_the_instance_does(alice_instance, candidate):
    credentials = auth.InstanceCredentials(
        alice_instance.pk, alice_instance.name, alice_instance.token_salt, alice_instance.evolution_token_hash)
    if candidate == "webhook token":
        candidate = alice_instance.webhook_token

    assert credentials.webhook_token == alice_instance.webhook_token
    assert credentials.check_webhook_token(candidate) == alice_instance.check_webhook_token(candidate)
    assert credentials.check_webhook_token(candidate) == (candidate == alice_instance.webhook_token)
    assert outcome(credentials.check_evolution_token, candidate) == outcome(alice_instance.check_evolution_token,
                                                                           candidate)
    if auth.credential(candidate) is not None:  # what the webhook lets reach the check
        assert credentials.check_evolution_token(candidate) == (candidate == "TOKEN-ALICE-MAIN")


def outcome(check: Any, candidate: str) -> object:
    # The answer, or the kind of error: a lone surrogate never reaches the Evolution token's check
    # (auth.credential refuses it first), and there both raise alike.
    try:
        return check(candidate)
    except Exception as exc:
        return type(exc)


@pytest.mark.parametrize("candidate", CANDIDATES)
def test_an_instance_without_an_evolution_token_is_proven_by_none(alice_instance, candidate):
    Instance.objects.filter(pk=alice_instance.pk).update(evolution_token_hash="")
    instance = Instance.objects.get(pk=alice_instance.pk)
    credentials = auth.InstanceCredentials(instance.pk, instance.name, instance.token_salt, "")

    assert outcome(instance.check_evolution_token, candidate) is False
    assert outcome(credentials.check_evolution_token, candidate) is False


def test_the_jwt_scheme_is_checked_against_the_cached_credentials(alice_instance):
    signed = jwt.encode({"app": "evolution", "action": "webhook", "iat": 0, "exp": 2**40},
                        alice_instance.webhook_token, algorithm="HS256")
    assert authenticate(**token_header(alice_instance)) is not None  # cached now

    with CaptureQueriesContext(connection) as queries:
        assert authenticate(HTTP_AUTHORIZATION=f"Bearer {signed}") is not None
    assert queries.captured_queries == []
