"""bench.context.purge_queues empties our side of Evolution's channel, wherever its vhost is.

The bench runs Evolution's events on their own vhost (`evolution`, as `make run` does): a purge through the
Celery broker's connection never reached them, and every busy run's unconsumed receipts were the next run's
consumer's first work (170,000 of them after a day of benches)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from kombu import Connection

from bench.context import purge_queues
from ingestion.consumer import topology


def _on_vhost(url: str, vhost: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + vhost))


def test_it_empties_the_ingest_queue_on_evolutions_own_vhost(settings):
    url = _on_vhost(settings.EVOLUTION_RABBITMQ_URL or settings.CELERY_BROKER_URL, "evolution")
    assert _on_vhost(settings.CELERY_BROKER_URL, "evolution") != settings.CELERY_BROKER_URL  # another vhost
    ours = topology()
    with Connection(url) as conn:
        channel = conn.default_channel
        bound = ours.work.bind(channel)
        bound.declare()
        producer = conn.Producer(channel)
        for n in range(3):
            producer.publish({"left": n}, exchange="", routing_key=ours.work.name, retry=True)

        settings.EVOLUTION_RABBITMQ_URL = url
        purge_queues()

        # a purge answers only once the queue is empty: nothing is left to get
        assert bound.get(no_ack=True) is None
