"""Long-running RabbitMQ consumer of Evolution events; reconnects forever, stops on SIGTERM."""

from __future__ import annotations

import logging
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from kombu import Connection

from ingestion.consumer import EvolutionConsumer, topology
from messaging.models import Instance

log = logging.getLogger("ingestion.consumer")


class Command(BaseCommand):
    help = "Consume Evolution events from RabbitMQ and forward them to the webhook handler."

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.EVOLUTION_RABBITMQ_URL:
            raise CommandError("EVOLUTION_RABBITMQ_URL is not set: the RabbitMQ channel is off")
        names = list(Instance.objects.values_list("name", flat=True))
        with Connection(settings.EVOLUTION_RABBITMQ_URL, heartbeat=30) as connection:
            worker = EvolutionConsumer(connection, topology(names))

            def stop(signum: int, frame: Any) -> None:
                worker.should_stop = True

            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
            log.info("consumer started on %s", settings.EVOLUTION_RABBITMQ_EXCHANGE)
            worker.run()
        log.info("consumer stopped")
