"""The RabbitMQ channel on the real broker: save, forward with already_saved, ack; delays, parking,
locks, database outages and per-instance exchanges."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid

import amqp
import pytest
from django.db import connection as db_connection
from django.test.utils import CaptureQueriesContext
from kombu import Connection

from ingestion import consumer as consumer_module
from ingestion import inbox, receive
from ingestion.locks import DONE, LOCK_PREFIX, event_lock
from ingestion.models import IngestionEvent
from messaging.models import Message, Status
from pilot_status import metrics
from tests.conftest import add_instance
from tests.ingestion.helpers import counter, make_message, receipt
from tests.ingestion.outage import stopped

DEAD_URL = "http://127.0.0.1:9/api/internal/webhook"  # nothing listens on the discard port


@pytest.fixture
def exchange_name(settings):
    # Fresh exchange and queues per test: parallel runs and leftovers never meet.
    settings.EVOLUTION_RABBITMQ_EXCHANGE = f"evolution_test_{uuid.uuid4().hex[:8]}"
    settings.EVOLUTION_RABBITMQ_QUEUE_PREFIX = f"ps.test.{uuid.uuid4().hex[:8]}"
    return settings.EVOLUTION_RABBITMQ_EXCHANGE


@pytest.fixture
def connection(settings):
    with Connection(settings.EVOLUTION_RABBITMQ_URL, transport_options={"confirm_publish": True}) as conn:
        yield conn


def declare(connection, topology):
    channel = connection.default_channel
    topology.work.bind(channel).declare()
    for queue in [*topology.retries, topology.parking]:
        queue.bind(channel).declare()


@pytest.fixture
def topo(connection, exchange_name):
    topology = consumer_module.topology()
    declare(connection, topology)
    yield topology
    channel = connection.default_channel
    for queue in [topology.work, *topology.retries, topology.parking]:
        queue.bind(channel).delete()
    for exchange in topology.exchanges:
        exchange.bind(channel).delete()


def publish_like_evolution(connection, exchange, payload, routing_key="messages.update", headers=None):
    # Evolution publishes with no properties at all: no content_type, no delivery_mode.
    props = {"application_headers": headers} if headers else {}
    channel = connection.default_channel
    channel.basic_publish(amqp.Message(json.dumps(payload).encode(), **props), exchange=exchange, routing_key=routing_key)


class Handled(Exception):
    pass


def consume(worker, count=1, timeout=10):
    """Run the consumer until it has handled `count` messages (socket.timeout if idle too long).

    A copy kept for another look (lockwait.py) is handled from `on_iteration`, with no delivery for
    the loop to yield on, so the count is checked there too."""
    start = worker.handled
    own_iteration = worker.on_iteration

    def on_iteration():
        own_iteration()
        if worker.handled - start >= count:
            raise Handled

    worker.on_iteration = on_iteration
    try:
        for _ in worker.consume(timeout=timeout):
            if worker.handled - start >= count:
                break
    except Handled:
        pass
    finally:
        worker.on_iteration = own_iteration
    return worker


def run_once(connection, topology, count=1, timeout=10, **kwargs):
    return consume(consumer_module.EvolutionConsumer(connection, topology, **kwargs), count, timeout)


def depth(connection, queue):
    _, count, _ = queue.bind(connection.default_channel).queue_declare(passive=True)
    return count


@contextlib.contextmanager
def acks_sent():
    """Every basic_ack the channel sends, as (delivery tag, multiple); a spy: each one still reaches the broker."""
    sent: list[tuple[int, bool]] = []
    real_ack = amqp.Channel.basic_ack

    def counting_ack(channel, delivery_tag, multiple=False, **kwargs):
        sent.append((delivery_tag, multiple))
        return real_ack(channel, delivery_tag, multiple=multiple, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(amqp.Channel, "basic_ack", counting_ack)
        yield sent


@pytest.fixture
def sent_message(alice, alice_instance):
    return make_message(alice.project, alice_instance)


@pytest.fixture
def web(live_server, settings):
    settings.INTERNAL_WEBHOOK_URL = f"{live_server.url}/api/internal/webhook"
    return live_server


def test_it_saves_forwards_and_acks(transactional_db, web, connection, topo, sent_message, exchange_name):
    publish_like_evolution(connection, exchange_name, receipt("DELIVERY_ACK", channel="rabbitmq"))

    run_once(connection, topo)

    event = IngestionEvent.objects.get()
    assert event.channel == "RABBITMQ" and event.processed_at is not None
    assert "destination" not in event.payload
    sent_message.refresh_from_db()
    assert sent_message.status == Status.DELIVERED
    assert counter("rabbitmq:forward_ok") == 1
    assert depth(connection, topo.work) == 0  # acked


def test_it_forwards_and_acks_with_no_transaction_open(transactional_db, web, connection, topo, sent_message,
                                                        exchange_name, monkeypatch):
    # The row is committed before the forward waits on the webhook and before the (batched) ack: an open
    # transaction there would hold the new inbox row's locks for as long as the webhook or the broker takes.
    states: list[tuple[str, bool, str]] = []

    def spy(name, real):
        def call(*args, **kwargs):
            raw = db_connection.connection
            states.append((name, db_connection.in_atomic_block, "" if raw is None else raw.info.transaction_status.name))
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(consumer_module.forwarding, "forward", spy("forward", consumer_module.forwarding.forward))
    monkeypatch.setattr(amqp.Channel, "basic_ack", spy("ack", amqp.Channel.basic_ack))
    publish_like_evolution(connection, exchange_name, receipt("DELIVERY_ACK", channel="rabbitmq"))

    run_once(connection, topo)

    assert {name for name, _, _ in states} == {"forward", "ack"}
    assert all(not atomic and status == "IDLE" for _, atomic, status in states), states


@pytest.mark.parametrize("done_mark", ["kept", "expired"])
def test_an_event_already_processed_by_the_webhook_is_skipped(
    transactional_db, web, connection, topo, sent_message, exchange_name, done_mark
):
    webhook_copy = receipt("DELIVERY_ACK")
    receive.receive_webhook(webhook_copy)
    lock_key = LOCK_PREFIX + inbox.dedup_key(webhook_copy)
    assert metrics.redis().get(lock_key) == DONE
    if done_mark == "expired":  # or lost by Redis: the inbox answers instead
        metrics.redis().delete(lock_key)
    publish_like_evolution(connection, exchange_name, receipt("DELIVERY_ACK", channel="rabbitmq"))

    with CaptureQueriesContext(db_connection) as queries:
        run_once(connection, topo)

    assert len(queries.captured_queries) == (0 if done_mark == "kept" else 1), queries.captured_queries
    assert metrics.redis().get(lock_key) == DONE  # the inbox's answer leaves the mark too
    assert IngestionEvent.objects.get().channel == "WEBHOOK"
    assert counter("rabbitmq:forward_ok") == 0 and counter("rabbitmq:skipped") == 1
    assert sent_message.events.filter(kind="STATUS").count() == 1
    assert depth(connection, topo.work) == 0


def test_a_failed_forward_waits_in_a_retry_queue_then_succeeds(
    transactional_db, live_server, settings, connection, topo, sent_message, exchange_name
):
    # given: the web is unreachable when the consumer forwards
    settings.INTERNAL_WEBHOOK_URL = DEAD_URL
    publish_like_evolution(connection, exchange_name, receipt("READ", channel="rabbitmq"))

    run_once(connection, topo)

    # then: saved once, not processed, parked 5 s in the first retry queue (no hot loop)
    assert counter("rabbitmq:forward_fail") == 1
    assert depth(connection, topo.retries[0]) == 1 and depth(connection, topo.work) == 0
    event = IngestionEvent.objects.get()
    assert event.processed_at is None and event.forward_attempts == 1

    # when: the web is back, the message returns from the retry queue by itself (TTL + DLX)
    settings.INTERNAL_WEBHOOK_URL = f"{live_server.url}/api/internal/webhook"
    run_once(connection, topo, timeout=30)

    event.refresh_from_db()
    assert event.processed_at is not None
    sent_message.refresh_from_db()
    assert sent_message.status == Status.READ
    assert counter("rabbitmq:forward_ok") == 1


def test_after_the_last_retry_it_parks_the_message(transactional_db, settings, connection, topo, sent_message, exchange_name):
    settings.INTERNAL_WEBHOOK_URL = DEAD_URL
    retries = len(consumer_module.RETRY_DELAYS_S)
    publish_like_evolution(connection, exchange_name, receipt("READ", channel="rabbitmq"),
                           headers={consumer_module.RETRY_HEADER: retries})

    run_once(connection, topo)

    assert depth(connection, topo.parking) == 1
    assert all(depth(connection, q) == 0 for q in topo.retries)
    assert counter("rabbitmq:parked") == 1
    assert IngestionEvent.objects.get().processed_at is None  # the reconciler still sees it


def test_a_lock_held_past_the_local_looks_delays_without_storing_or_using_a_retry(
    transactional_db, web, connection, topo, sent_message, exchange_name
):
    payload = receipt("READ", channel="rabbitmq")
    publish_like_evolution(connection, exchange_name, payload)

    with event_lock(inbox.dedup_key(payload), "webhook:skipped") as held:  # the webhook is on it the whole time
        assert held
        started = time.monotonic()
        run_once(connection, topo)
        took = time.monotonic() - started

    # looked at again LOCK_WAIT_TRIES times, LOCK_WAIT_S apart, then in the 5 s queue
    assert took >= consumer_module.LOCK_WAIT_TRIES * consumer_module.LOCK_WAIT_S
    assert counter("rabbitmq:lock_waited") == 1 and counter("rabbitmq:requeued") == 1
    assert IngestionEvent.objects.count() == 0
    assert depth(connection, topo.retries[0]) == 1 and depth(connection, topo.work) == 0
    _, _, message = None, None, topo.retries[0].bind(connection.default_channel).get(no_ack=True)
    assert message.headers[consumer_module.RETRY_HEADER] == 0


def release_on_first_wait(worker, release):
    """Make the other channel give the lock back right after the consumer's first look found it held."""
    looks = []

    def handle(message):
        result = consumer_module.EvolutionConsumer.handle(worker, message)
        looks.append(result)
        if result == consumer_module.WAITING and len(looks) == 1:
            release()
        return result

    worker.handle = handle
    return looks


@pytest.mark.parametrize("released_as", ["done", "free"])
def test_a_lock_given_back_while_the_copy_waits_locally_settles_it_without_the_delay_queue(
    transactional_db, web, connection, topo, sent_message, exchange_name, released_as
):
    payload = receipt("READ", channel="rabbitmq")
    publish_like_evolution(connection, exchange_name, payload)
    webhook = contextlib.ExitStack()
    held = webhook.enter_context(event_lock(inbox.dedup_key(payload), "webhook:skipped"))
    assert held
    if released_as == "done":  # the webhook processed the event: its release leaves the done mark
        held.finish()
    worker = consumer_module.EvolutionConsumer(connection, topo)
    looks = release_on_first_wait(worker, webhook.close)

    try:
        consume(worker)
    finally:
        webhook.close()

    assert looks == [consumer_module.WAITING, "skipped" if released_as == "done" else "forwarded"]
    assert counter("rabbitmq:lock_waited") == 1 and counter("rabbitmq:requeued") == 0
    assert [depth(connection, q) for q in [topo.work, *topo.retries, topo.parking]] == [0] * (len(topo.retries) + 2)
    if released_as == "done":  # acked on the done mark, nothing stored
        assert counter("rabbitmq:skipped") == 1 and IngestionEvent.objects.count() == 0
    else:  # the lock is free: handled as usual
        event = IngestionEvent.objects.get()
        assert event.channel == "RABBITMQ" and event.processed_at is not None
        sent_message.refresh_from_db()
        assert sent_message.status == Status.READ
        assert counter("rabbitmq:forward_ok") == 1


def test_a_copy_waiting_locally_is_never_acked_by_a_later_deliverys_ack(
    transactional_db, connection, topo, exchange_name, settings
):
    # Acks go with `multiple` on the newest handled delivery: sent for one handled after the waiting
    # copy, it would ack that copy too, and a crash before its next look would lose it.
    settings.CONSUMER_ACK_BATCH = 2  # the delivery after the waiting one fills a batch
    before, waiting, after = (receipt("READ", key_id=f"WAIT{n}", channel="rabbitmq") for n in range(3))
    for payload in (before, after):  # the webhook had them
        metrics.redis().set(LOCK_PREFIX + inbox.dedup_key(payload), DONE, ex=60)
    metrics.redis().set(LOCK_PREFIX + inbox.dedup_key(waiting), "webhook", ex=60)  # the webhook is on it
    for payload in (before, waiting, after):
        publish_like_evolution(connection, exchange_name, payload)
    with Connection(settings.EVOLUTION_RABBITMQ_URL) as own, acks_sent() as sent:
        worker = consumer_module.EvolutionConsumer(own, topo)
        loop = worker.consume(timeout=5)
        for _ in loop:
            if worker.handled == 2:  # before and after skipped on the done mark, the other one waits
                break
        assert len(worker.waits) == 1
        worker.acks.flush()  # whatever is pending goes now
        # the process dies here: its connection closes without another ack
        worker.waits.forget()
        worker.acks.forget()
        loop.close()

    assert sent == [(1, True)]  # only the one before the waiting copy
    deadline = time.monotonic() + 5
    while depth(connection, topo.work) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    work = topo.work.bind(connection.default_channel)
    back = [json.loads(work.get(no_ack=True).body)["data"]["keyId"] for _ in range(depth(connection, topo.work))]
    assert sorted(back) == ["WAIT1", "WAIT2"]  # the waiting copy is redelivered (and the one held behind it)
    assert counter("rabbitmq:lock_waited") == 1 and counter("rabbitmq:requeued") == 0


def test_once_asked_to_stop_it_hands_copies_waiting_locally_back_untouched(
    transactional_db, connection, topo, exchange_name, settings
):
    payload = receipt("READ", channel="rabbitmq")
    metrics.redis().set(LOCK_PREFIX + inbox.dedup_key(payload), "webhook", ex=60)  # the webhook is on it
    publish_like_evolution(connection, exchange_name, payload)
    with Connection(settings.EVOLUTION_RABBITMQ_URL) as own:
        worker = consumer_module.EvolutionConsumer(own, topo)
        with contextlib.closing(worker.consume(timeout=5)) as loop:
            for _ in loop:
                if worker.waits:
                    worker.should_stop = True  # SIGTERM arrives while the copy waits for its next look
        # handed back while the connection is still open: ready in the work queue, not unacked (the broker takes the
        # reject in its own time)
        deadline = time.monotonic() + 5
        while depth(connection, topo.work) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert depth(connection, topo.work) == 1
        assert worker.handled == 0

    assert counter("rabbitmq:lock_waited") == 1 and counter("rabbitmq:requeued") == 0
    assert all(depth(connection, q) == 0 for q in [*topo.retries, topo.parking])
    assert IngestionEvent.objects.count() == 0
    message = topo.work.bind(connection.default_channel).get(no_ack=True)
    assert json.loads(message.body) == payload  # untouched: no retry header, nothing stored
    assert consumer_module.RETRY_HEADER not in (message.headers or {})


def test_garbage_is_parked(transactional_db, connection, topo, exchange_name):
    channel = connection.default_channel
    channel.basic_publish(amqp.Message(b"not json"), exchange=exchange_name, routing_key="messages.update")

    run_once(connection, topo)

    assert depth(connection, topo.parking) == 1
    assert IngestionEvent.objects.count() == 0


@pytest.mark.serial
def test_a_database_outage_waits_in_the_30s_queue_without_using_a_retry(
    transactional_db, web, connection, topo, sent_message, exchange_name
):
    publish_like_evolution(connection, exchange_name, receipt("READ", channel="rabbitmq"))
    worker = consumer_module.EvolutionConsumer(connection, topo)

    with stopped("postgres"):
        consume(worker)

    assert depth(connection, topo.retries[1]) == 1 and depth(connection, topo.work) == 0
    message = topo.retries[1].bind(connection.default_channel).get(no_ack=True)
    assert message.headers[consumer_module.RETRY_HEADER] == 0
    assert IngestionEvent.objects.count() == 0


def test_per_instance_mode_follows_instances_added_later(
    transactional_db, web, settings, connection, exchange_name, alice, alice_instance
):
    # given: per-instance mode, started when only alice-main existed
    settings.EVOLUTION_RABBITMQ_PER_INSTANCE = True
    topology = consumer_module.topology(["alice-main"])
    declare(connection, topology)
    later_name = f"later-{uuid.uuid4().hex[:6]}"
    try:
        worker = consumer_module.EvolutionConsumer(
            connection, topology, instance_source=consumer_module.instance_names_from_db, refresh_seconds=0
        )
        assert {e.name for e in topology.exchanges} == {exchange_name, "alice-main"}

        # when: an instance is added while it runs, and Evolution publishes on its exchange
        later = add_instance(alice.project, later_name)
        message = make_message(alice.project, later, key_id="3EB0LATERLATERLATER000")
        for _ in worker.consume(limit=1, timeout=5):  # one idle pass: re-reads the instances
            break
        assert later_name in worker.bound
        publish_like_evolution(connection, later_name, receipt("READ", key_id="3EB0LATERLATERLATER000", instance=later_name, channel="rabbitmq"))
        publish_like_evolution(connection, "alice-main", receipt("READ", channel="rabbitmq"))
        consume(worker, count=2)

        # then: both instance exchanges reach the consumer
        message.refresh_from_db()
        assert message.status == Status.READ
        assert IngestionEvent.objects.filter(channel="RABBITMQ").count() == 2
    finally:
        channel = connection.default_channel
        for queue in [topology.work, *topology.retries, topology.parking]:
            queue.bind(channel).delete()
        for name in (exchange_name, "alice-main", later_name):
            channel.exchange_delete(name)


def test_once_asked_to_stop_it_hands_prefetched_messages_back_untouched(
    transactional_db, web, connection, topo, sent_message, exchange_name, settings
):
    for status in ("SERVER_ACK", "DELIVERY_ACK", "READ"):
        publish_like_evolution(connection, exchange_name, receipt(status, channel="rabbitmq"))
    handled = []
    with Connection(settings.EVOLUTION_RABBITMQ_URL) as own:  # closed before counting: unacked go back
        worker = consumer_module.EvolutionConsumer(own, topo)

        def handle(message):
            handled.append(message)
            worker.should_stop = True  # SIGTERM arrives while the first message is being handled
            return consumer_module.EvolutionConsumer.handle(worker, message)

        worker.handle = handle
        with contextlib.closing(worker.consume(timeout=2)) as loop:
            for _ in loop:
                if worker.should_stop:
                    break

    assert len(handled) == 1  # the one in hand is finished, the other two go back to the queue
    assert IngestionEvent.objects.count() == 1
    deadline = time.monotonic() + 5
    while depth(connection, topo.work) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert depth(connection, topo.work) == 2


def test_deliveries_arriving_during_a_confirm_wait_are_handled_after_it_never_inside(
    transactional_db, connection, topo, exchange_name, settings
):
    # Each delayed copy waits for the broker's publisher confirm, and py-amqp hands deliveries that
    # arrive meanwhile to the consumer's callback from inside that wait. Handled there, a nested
    # publish could take the confirm (RabbitMQ confirms several publishes with one `multiple` ack)
    # and leave the outer wait blocked until the broker dropped the connection for missed
    # heartbeats: the bench saw the RabbitMQ channel stall for a minute that way.
    from pilot_status import metrics

    count = 120
    payloads = [receipt("READ", key_id=f"BURST{n:04d}", channel="rabbitmq") for n in range(count)]
    for payload in payloads:  # the webhook channel is on every one of them right now
        metrics.redis().set(LOCK_PREFIX + inbox.dedup_key(payload), "webhook", ex=60)
    for payload in payloads:
        publish_like_evolution(connection, exchange_name, payload)

    with Connection(settings.EVOLUTION_RABBITMQ_URL, heartbeat=30, transport_options={"confirm_publish": True}) as own:
        worker = consumer_module.EvolutionConsumer(own, topo)
        depth_now, deepest = [0], [0]

        def handle(message):
            depth_now[0] += 1
            deepest[0] = max(deepest[0], depth_now[0])
            try:
                return consumer_module.EvolutionConsumer.handle(worker, message)
            finally:
                depth_now[0] -= 1

        worker.handle = handle
        runner = threading.Thread(target=consume, args=(worker, count, 10), daemon=True)
        runner.start()
        runner.join(30)
        stalled = runner.is_alive()
        if stalled:
            own.collect()  # let the stuck read go so that the thread ends with the test

    assert not stalled and worker.handled == count
    assert deepest[0] == 1  # one message at a time, even with a prefetched batch arriving mid-wait
    assert depth(connection, topo.retries[0]) == count and depth(connection, topo.work) == 0
    assert IngestionEvent.objects.count() == 0


def test_handled_deliveries_are_acked_in_batches_and_none_is_left_unacked(
    transactional_db, connection, topo, exchange_name, settings
):
    # A quorum queue settles each ack through its Raft log: one `multiple` ack per batch.
    batch = settings.CONSUMER_ACK_BATCH = 20  # the default, set here so that CONSUMER_ACK_BATCH=1 runs it too
    count = batch * 2 + 5
    for n in range(count):
        payload = receipt("READ", key_id=f"BATCH{n:04d}", channel="rabbitmq")
        metrics.redis().set(LOCK_PREFIX + inbox.dedup_key(payload), DONE, ex=60)  # the webhook had them
        publish_like_evolution(connection, exchange_name, payload)
    with Connection(settings.EVOLUTION_RABBITMQ_URL) as own:
        worker = consumer_module.EvolutionConsumer(own, topo)
        # The acks' clock stands still while the deliveries stream in, so that a stall of this process (a loaded
        # host) cannot flush a partial batch on time; it jumps ahead before the idle second.
        now = [0.0]
        worker.acks.clock = lambda: now[0]
        with acks_sent() as sent:
            loop = worker.consume(timeout=1)
            for _ in loop:
                if worker.handled == count:
                    break
            assert worker.acks.pending == count - batch * 2
            now[0] = consumer_module.ACK_MAX_DELAY_S
            with pytest.raises(socket.timeout):  # idle for 1 s: the last five are acked meanwhile
                next(loop)
            acked_while_idle = list(sent)
            loop.close()

    assert worker.handled == count
    assert sent[:2] == [(batch, True), (batch * 2, True)]
    assert acked_while_idle == sent and len(sent) == 3 and sent[-1] == (count, True)
    assert counter("rabbitmq:skipped") == count
    assert depth(connection, topo.work) == 0  # the connection is closed: an unacked one would be back


@pytest.mark.parametrize("batch", [20, 1], ids=["batched-acks", "one-ack-each"])
def test_with_either_ack_batch_every_delivery_is_handled_once_and_acked(
    transactional_db, web, connection, topo, alice, alice_instance, exchange_name, settings, batch
):
    """CONSUMER_ACK_BATCH (issue 25's switch): batches of 20 or one ack per delivery at once lose
    nothing and leave nothing unacked, with new events (stored, forwarded) and the webhook's
    (skipped on the done mark) mixed. Acks are counted from the channel's own basic_ack."""
    settings.CONSUMER_ACK_BATCH = batch
    count = 45
    fresh = []
    for n in range(count):
        payload = receipt("READ", key_id=f"MIX{n:04d}", channel="rabbitmq")
        if n % 3 == 0:  # the webhook had it
            metrics.redis().set(LOCK_PREFIX + inbox.dedup_key(payload), DONE, ex=60)
        else:
            fresh.append(make_message(alice.project, alice_instance, key_id=f"MIX{n:04d}").evolution_message_id)
        publish_like_evolution(connection, exchange_name, payload)
    with Connection(settings.EVOLUTION_RABBITMQ_URL) as own, acks_sent() as sent:
        worker = consumer_module.EvolutionConsumer(own, topo)
        loop = worker.consume(timeout=10)
        for _ in loop:
            if worker.handled == count:
                break
        if batch == 1:
            assert worker.acks.pending == 0 and sent == [(tag, False) for tag in range(1, count + 1)]
        loop.close()  # leaving the loop acks what is pending, on the open connection

    assert worker.handled == count
    if batch == 1:
        assert sent == [(tag, False) for tag in range(1, count + 1)]
    else:
        # `multiple` acks of at most 20 deliveries each (fewer when one waited 0.1 s), the last one the newest.
        tags = [0] + [tag for tag, _ in sent]
        assert all(multiple for _, multiple in sent) and tags[-1] == count
        assert all(0 < newer - older <= batch for older, newer in zip(tags, tags[1:]))
    events = IngestionEvent.objects.all()
    assert sorted(e.payload["data"]["keyId"] for e in events) == fresh  # each new one stored, once
    assert all(e.channel == "RABBITMQ" and e.processed_at is not None for e in events)
    assert set(Message.objects.filter(evolution_message_id__in=fresh).values_list("status", flat=True)) == {Status.READ}
    assert counter("rabbitmq:forward_ok") == len(fresh) and counter("rabbitmq:skipped") == count - len(fresh)
    # The consuming connection is closed: an unacked delivery would be back in the work queue.
    assert depth(connection, topo.work) == 0
    assert [depth(connection, q) for q in [*topo.retries, topo.parking]] == [0] * (len(topo.retries) + 1)


def test_deliveries_handled_but_not_yet_acked_come_again_after_a_crash_and_are_skipped(
    transactional_db, web, connection, topo, sent_message, exchange_name, settings
):
    settings.CONSUMER_ACK_BATCH = 20  # batched acks are what leaves handled deliveries unacked
    for status in ("SERVER_ACK", "DELIVERY_ACK"):
        publish_like_evolution(connection, exchange_name, receipt(status, channel="rabbitmq"))
    with Connection(settings.EVOLUTION_RABBITMQ_URL) as own:
        worker = consumer_module.EvolutionConsumer(own, topo)
        loop = worker.consume(timeout=5)
        for _ in loop:
            if worker.handled == 2:
                break
        assert worker.acks.pending == 2  # handled and committed, the ack not sent yet
        worker.acks.forget()  # the process dies here: its connection closes without the ack
        loop.close()
    assert IngestionEvent.objects.count() == 2
    deadline = time.monotonic() + 5
    while depth(connection, topo.work) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert depth(connection, topo.work) == 2  # redelivered, not lost

    run_once(connection, topo, count=2)

    assert IngestionEvent.objects.count() == 2  # skipped, not stored or applied twice
    assert sent_message.events.filter(kind="STATUS").count() == 2
    assert counter("rabbitmq:forward_ok") == 2 and counter("rabbitmq:skipped") == 2
    assert depth(connection, topo.work) == 0
