"""POST /api/internal/webhook: Evolution's authentication, the inbox, 400/401/503, lock and Redis."""

from __future__ import annotations

import copy
import time

import jwt
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ingestion import inbox
from ingestion.locks import DONE, DONE_TTL_SECONDS, LOCK_PREFIX, event_lock
from ingestion.models import IngestionEvent
from messaging.models import Status
from pilot_status import metrics
from tests.conftest import add_instance
from tests.ingestion.helpers import URL, counter, make_message, post, receipt, sample, token_header
from tests.ingestion.outage import stopped
from tests.support.private_redis import PrivateRedis


@pytest.fixture
def sent_message(alice, alice_instance):
    return make_message(alice.project, alice_instance)


def test_it_applies_a_receipt_and_counts_it(sent_message, alice_instance):
    response = post(receipt("DELIVERY_ACK"), **token_header(alice_instance))

    assert response.status_code == 200
    assert response.json() == {"status": "processed", "reason": "applied"}
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED
    event = IngestionEvent.objects.get()
    assert event.channel == "WEBHOOK" and event.processed_at is not None
    assert event.payload["destination"]  # the raw payload, as Evolution sent it
    assert counter("webhook:processed") == 1


def test_it_skips_evolutions_retry_of_the_same_event(sent_message, alice_instance):
    payload = receipt("SERVER_ACK")
    post(payload, **token_header(alice_instance))
    retried = copy.deepcopy(payload)
    retried["date_time"] = "2025-10-21T11:49:00.000Z"

    response = post(retried, **token_header(alice_instance))

    assert response.status_code == 200
    assert response.json() == {"status": "skipped", "reason": "already_processed"}
    assert IngestionEvent.objects.count() == 1
    assert counter("webhook:skipped") == 1
    assert sent_message.events.filter(kind="STATUS").count() == 1


def test_it_answers_skipped_when_the_event_is_locked_elsewhere(sent_message, alice_instance):
    payload = receipt("DELIVERY_ACK")
    with event_lock(inbox.dedup_key(payload), "rabbitmq:skipped") as held:  # the RabbitMQ channel is on it right now
        assert held
        response = post(payload, **token_header(alice_instance))

    assert response.status_code == 200
    assert response.json() == {"status": "skipped", "reason": "in_progress_elsewhere"}
    assert counter("webhook:skipped") == 1
    assert IngestionEvent.objects.count() == 0  # the lock holder stores it


def test_a_late_receipt_never_moves_a_message_back(sent_message, alice_instance):
    for status in ("READ", "DELIVERY_ACK", "SERVER_ACK"):
        assert post(receipt(status), **token_header(alice_instance)).status_code == 200
    sent_message.refresh_from_db()
    assert sent_message.status == Status.READ
    assert IngestionEvent.objects.count() == 3  # two statuses are two events


def test_the_by_events_path_is_accepted(sent_message, alice_instance):
    response = post(receipt("SERVER_ACK"), f"{URL}/messages-update", **token_header(alice_instance))
    assert response.status_code == 200
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SERVER_ACK


def test_it_accepts_evolutions_jwt_key_scheme(sent_message, alice_instance):
    now = int(time.time())
    token = jwt.encode(
        {"iat": now, "exp": now + 600, "app": "evolution", "action": "webhook"},
        alice_instance.webhook_token,
        algorithm="HS256",
    )
    response = post(receipt("SERVER_ACK"), HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200


def test_it_accepts_the_instance_token_as_body_apikey(sent_message, alice_instance):
    payload = receipt("SERVER_ACK")
    payload["apikey"] = "TOKEN-ALICE-MAIN"
    assert post(payload).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{}, {"HTTP_X_WEBHOOK_TOKEN": "wrong"}, {"HTTP_AUTHORIZATION": "Bearer not-a-jwt"}],
)
def test_unauthenticated_events_are_401_and_store_nothing(sent_message, alice_instance, headers):
    payload = receipt("DELIVERY_ACK")
    payload["apikey"] = "wrong"
    response = post(payload, **headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert IngestionEvent.objects.count() == 0
    assert counter("webhook:unauthorized") == 1
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


def test_another_instances_token_is_refused(sent_message, alice_instance, carol):
    other = add_instance(carol.project, "carol-main")
    response = post(receipt("DELIVERY_ACK"), **token_header(other))
    assert response.status_code == 401


def test_a_forged_already_saved_is_refused_and_changes_nothing(sent_message, alice_instance):
    payload = receipt("DELIVERY_ACK")
    payload["already_saved"] = True
    for headers in ({}, {"HTTP_X_INTERNAL_WEBHOOK_SECRET": "guess"}, token_header(alice_instance)):
        assert post(payload, **headers).status_code == 401
    assert IngestionEvent.objects.count() == 0
    sent_message.refresh_from_db()
    assert sent_message.status == Status.SENT


def test_an_internal_forward_runs_the_logic_on_the_saved_row(sent_message, alice_instance, settings):
    payload = receipt("READ")
    inbox.record("RABBITMQ", payload)
    forwarded = dict(payload, already_saved=True)

    response = post(forwarded, HTTP_X_INTERNAL_WEBHOOK_SECRET=settings.INTERNAL_WEBHOOK_SECRET)

    assert response.json() == {"status": "processed", "reason": "applied"}
    event = IngestionEvent.objects.get()
    assert event.channel == "RABBITMQ" and event.processed_at is not None
    assert "already_saved" not in event.payload
    sent_message.refresh_from_db()
    assert sent_message.status == Status.READ


@pytest.mark.parametrize(
    "payload",
    [{"event": "messages.update", "instance": "alice-main"},
     {"event": "Not An Event!", "instance": "alice-main", "data": {}},
     {"event": "messages.update", "instance": "alice-main", "data": "x"},
     {"event": 3, "instance": "alice-main", "data": {}}],
)
def test_a_payload_that_is_not_an_evolution_event_is_400_and_stores_nothing(alice_instance, payload):
    response = post(payload, **token_header(alice_instance))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "not_an_evolution_event"
    assert IngestionEvent.objects.count() == 0


@pytest.mark.parametrize("body", ["{nope", "[1, 2]", '"text"', "{}", '{"event": "x"}',
                                  '{"event": "messages.update", "instance": "", "data": {}}'])
def test_a_body_that_names_no_known_instance_is_401_before_any_validation(alice_instance, body):
    from django.test import Client

    # The token is valid for alice-main, but nothing in the body says the call is alice-main's.
    response = Client().post(URL, data=body, content_type="application/json", **token_header(alice_instance))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert IngestionEvent.objects.count() == 0


def test_our_own_processes_are_told_what_is_wrong_with_a_body(db, settings):
    from django.test import Client

    secret = {"HTTP_X_INTERNAL_WEBHOOK_SECRET": settings.INTERNAL_WEBHOOK_SECRET}
    response = Client().post(URL, data="{nope", content_type="application/json", **secret)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    response = Client().post(URL, data='{"already_saved": true}', content_type="application/json", **secret)
    assert response.status_code == 400 and response.json()["error"]["code"] == "not_an_evolution_event"


def test_get_is_405_json(db):
    from django.test import Client

    response = Client().get(URL)
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.serial
def test_it_answers_503_while_the_database_is_down_so_evolution_retries(transactional_db, alice, alice_instance):
    # given: a message whose receipt Evolution is about to post
    message = make_message(alice.project, alice_instance)
    payload, headers = receipt("DELIVERY_ACK"), token_header(alice_instance)

    # when: Postgres is really down
    with stopped("postgres"):
        during = post(payload, **headers)

    # then: 503 (retryable for Evolution), and Evolution's retry afterwards is applied once
    assert during.status_code == 503
    assert during.json()["error"]["code"] == "unavailable"
    assert IngestionEvent.objects.count() == 0
    after = post(payload, **headers)
    assert after.json() == {"status": "processed", "reason": "applied"}
    message.refresh_from_db()
    assert message.status == Status.DELIVERED


def test_it_keeps_ingesting_exactly_once_with_redis_really_down(sent_message, alice_instance, settings):
    # A private Redis, really stopped: the lock layer is gone, the inbox still dedups.
    redis = PrivateRedis().start()
    settings.CACHES = {
        "default": {**settings.CACHES["default"], "LOCATION": redis.url},
    }
    redis.stop()
    payload = receipt("DELIVERY_ACK")

    try:
        first = post(payload, **token_header(alice_instance))
        second = post(dict(payload, date_time="2025-10-21T11:50:00.000Z"), **token_header(alice_instance))
    finally:
        redis.cleanup()

    assert first.json() == {"status": "processed", "reason": "applied"}
    assert second.json() == {"status": "skipped", "reason": "already_processed"}
    assert IngestionEvent.objects.count() == 1
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED
    assert sent_message.events.filter(kind="STATUS").count() == 1


def test_an_overtaking_receipt_fills_the_implied_times(sent_message, alice_instance):
    post(sample("webhook.messages.update.READ.json"), **token_header(alice_instance))
    sent_message.refresh_from_db()
    assert sent_message.status == Status.READ
    assert sent_message.server_ack_at == sent_message.delivered_at == sent_message.read_at


def rekey(instance):
    # As another process would: no signal reaches this process's cache.
    from messaging.models import Instance

    Instance.objects.filter(pk=instance.pk).update(token_salt="re-keyed")
    return Instance.objects.get(pk=instance.pk)


def test_a_re_keyed_token_works_at_once_and_the_old_one_stops_within_seconds(
    sent_message, alice_instance, monkeypatch
):
    from ingestion import auth

    monkeypatch.setattr(auth, "AUTH_CACHE_SECONDS", 0.5)
    old = token_header(alice_instance)
    assert post(receipt("SERVER_ACK"), **old).status_code == 200  # cached now
    new = token_header(rekey(alice_instance))
    assert new != old

    # the new token is checked against the database when the cached copy refuses it
    assert post(receipt("DELIVERY_ACK"), **new).status_code == 200
    # the old one is refused once the cached copy is older than AUTH_CACHE_SECONDS
    time.sleep(0.6)
    assert post(receipt("READ"), **old).status_code == 401
    assert post(receipt("READ"), **new).status_code == 200


def test_an_unknown_instance_is_401_even_with_a_warm_cache(sent_message, alice_instance):
    assert post(receipt("SERVER_ACK"), **token_header(alice_instance)).status_code == 200
    stranger = receipt("READ", instance="nobody-knows")
    for _ in range(2):
        response = post(stranger, **token_header(alice_instance))
        assert response.status_code == 401
    assert IngestionEvent.objects.filter(instance_name="nobody-knows").count() == 0


def test_an_unknown_instance_name_costs_one_read_per_second_not_one_per_request(sent_message, alice_instance,
                                                                                monkeypatch):
    from ingestion import auth

    # Remembered long enough for three more posts however slow the machine is; then, once the
    # entry is older than the (shortened) bound, the name is looked up again.
    monkeypatch.setattr(auth, "UNKNOWN_CACHE_SECONDS", 60.0)
    stranger = receipt("READ", instance="nobody-knows")
    assert post(stranger, **token_header(alice_instance)).status_code == 401  # read: no such instance

    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert post(stranger, **token_header(alice_instance)).status_code == 401
    assert queries.captured_queries == []

    monkeypatch.setattr(auth, "UNKNOWN_CACHE_SECONDS", 0.3)
    time.sleep(0.35)
    with CaptureQueriesContext(connection) as queries:
        assert post(stranger, **token_header(alice_instance)).status_code == 401
    assert len(queries.captured_queries) == 1  # looked up again once the entry is older


def test_an_instance_added_in_this_process_is_known_at_once(sent_message, alice, alice_instance):
    newcomer = receipt("SERVER_ACK", instance="newcomer")
    assert post(newcomer, HTTP_X_WEBHOOK_TOKEN="not-yet").status_code == 401  # remembered as unknown

    added = add_instance(alice.project, "newcomer")  # its save clears the entry

    assert post(newcomer, **token_header(added)).status_code == 200


def test_a_copy_of_a_processed_event_costs_one_statement_once_its_done_mark_is_gone(sent_message, alice_instance):
    payload = receipt("DELIVERY_ACK")
    assert post(payload, **token_header(alice_instance)).json()["status"] == "processed"
    metrics.redis().delete(LOCK_PREFIX + inbox.dedup_key(payload))  # expired, or lost by Redis

    with CaptureQueriesContext(connection) as queries:  # the instance's auth material is cached by now
        response = post(dict(payload, date_time="2025-10-21T11:50:00.000Z"), **token_header(alice_instance))

    assert response.json() == {"status": "skipped", "reason": "already_processed"}
    # one statement (its transaction's BEGIN/COMMIT, savepoints under the test's transaction aside)
    statements = [q["sql"] for q in queries if "SAVEPOINT" not in (q["sql"] or "")]  # prepared: sql=None
    assert len(statements) == 1, statements



def between_requests():
    # What gunicorn's request_started does (Django's test client skips it): a pooled connection
    # is due for its health check again.
    from django.db import close_old_connections

    close_old_connections()


# Cached: the event's own transaction is the request's first statement. Not cached (a thousand numbers, each with an
# event every half minute, outlast AUTH_CACHE_SECONDS): the read of the instance's credentials is (bench B9 paid a
# SELECT 1 before every such webhook).
CREDENTIALS = pytest.mark.parametrize("credentials_cached", [True, False], ids=["credentials cached", "credentials read"])


def forget_credentials_unless(cached: bool) -> None:
    from ingestion import auth

    if not cached:
        auth._known.clear()


@CREDENTIALS
def test_a_healthy_pooled_connection_gets_no_select_1_before_a_webhook(transactional_db, alice, alice_instance,
                                                                      monkeypatch, credentials_cached):
    from django.db import connection

    make_message(alice.project, alice_instance)
    assert post(receipt("SERVER_ACK"), **token_header(alice_instance)).status_code == 200  # auth cached now
    forget_credentials_unless(credentials_cached)
    checks = []
    real = connection.is_usable
    monkeypatch.setattr(connection, "is_usable", lambda: checks.append(1) or real())

    between_requests()
    response = post(receipt("DELIVERY_ACK"), **token_header(alice_instance))

    assert response.json() == {"status": "processed", "reason": "applied"}
    assert checks == []  # the request's first statement was the check


@CREDENTIALS
def test_a_pooled_connection_postgres_dropped_is_replaced_and_the_event_applied(transactional_db, alice,
                                                                               alice_instance, credentials_cached):
    import psycopg
    from django.db import connection

    make_message(alice.project, alice_instance)
    assert post(receipt("SERVER_ACK"), **token_header(alice_instance)).status_code == 200  # auth cached now
    forget_credentials_unless(credentials_cached)

    # given: Postgres drops the pooled connection between two requests (as a restart does)
    params = connection.settings_dict
    with psycopg.connect(host=params["HOST"], port=params["PORT"], user=params["USER"],
                         password=params["PASSWORD"], dbname=params["NAME"], autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])

    # when / then: the next event is still stored and applied, on a fresh connection
    between_requests()
    response = post(receipt("DELIVERY_ACK"), **token_header(alice_instance))
    assert response.json() == {"status": "processed", "reason": "applied"}
    assert IngestionEvent.objects.filter(processed_at__isnull=False).count() == 2


def test_a_new_receipt_is_applied_and_stored_in_one_statement(sent_message, alice_instance):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    assert post(receipt("SERVER_ACK"), **token_header(alice_instance)).json()["reason"] == "applied"  # auth cached

    with CaptureQueriesContext(connection) as queries:
        response = post(receipt("DELIVERY_ACK"), **token_header(alice_instance))

    assert response.json() == {"status": "processed", "reason": "applied"}
    statements = [q["sql"] for q in queries if "SAVEPOINT" not in (q["sql"] or "")]  # prepared: sql=None
    assert len(statements) == 1, statements
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED
    assert list(sent_message.events.values_list("kind", "detail__status")) == [
        ("STATUS", "SERVER_ACK"), ("STATUS", "DELIVERED")]
    event = IngestionEvent.objects.get(payload__data__status="DELIVERY_ACK")
    assert (event.channel, event.outcome, event.processed_at is not None) == ("WEBHOOK", "applied", True)


def test_a_processed_event_leaves_a_done_mark_that_answers_its_copies_without_a_statement(
    sent_message, alice_instance
):
    payload = receipt("DELIVERY_ACK")
    assert post(payload, **token_header(alice_instance)).json()["status"] == "processed"
    lock_key = LOCK_PREFIX + inbox.dedup_key(payload)
    assert metrics.redis().get(lock_key) == DONE
    assert 0 < metrics.redis().ttl(lock_key) <= DONE_TTL_SECONDS

    with CaptureQueriesContext(connection) as queries:  # the instance's auth is cached by now
        response = post(payload, **token_header(alice_instance))

    assert response.json() == {"status": "skipped", "reason": "already_processed"}
    assert len(queries.captured_queries) == 0
    assert counter("webhook:processed") == 1 and counter("webhook:skipped") == 1


def test_a_receipt_waiting_for_its_message_leaves_no_mark(alice_instance):
    payload = receipt("DELIVERY_ACK", key_id="3EB0NOTSENTYET00000000")

    response = post(payload, **token_header(alice_instance))

    assert response.json() == {"status": "processed", "reason": "waiting_for_message"}
    assert metrics.redis().exists(LOCK_PREFIX + inbox.dedup_key(payload)) == 0  # released, not marked


def test_the_done_mark_never_replaces_another_holders_lock():
    with event_lock("a-dedup-key", "webhook:skipped") as hold:
        assert hold and not hold.done
        hold.finish()
        # Our lock expired and another holder took the event meanwhile.
        metrics.redis().set(LOCK_PREFIX + "a-dedup-key", "another-holder", ex=60)

    assert metrics.redis().get(LOCK_PREFIX + "a-dedup-key") == b"another-holder"
    with event_lock("a-dedup-key", "webhook:skipped") as hold:
        assert not hold and not hold.done


def test_the_lock_survives_a_redis_that_forgot_its_script(sent_message, alice_instance):
    payload = receipt("DELIVERY_ACK")
    assert post(payload, **token_header(alice_instance)).json()["status"] == "processed"
    metrics.redis().script_flush()  # a Redis restarted, or failed over to a replica

    response = post(payload, **token_header(alice_instance))

    assert response.json() == {"status": "skipped", "reason": "already_processed"}
    assert counter("webhook:skipped") == 1
