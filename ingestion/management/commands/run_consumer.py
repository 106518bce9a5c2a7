"""Long-running RabbitMQ consumer of Evolution events; reconnects forever, stops on SIGTERM."""

from __future__ import annotations

import logging
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from kombu import Connection

from ingestion.consumer import EvolutionConsumer, exchange_names, instance_names_from_db, topology
from pilot_status import heartbeats
from pilot_status.collector import freeze_startup_objects

log = logging.getLogger("ingestion.consumer")


class Command(BaseCommand):
    help = "Consume Evolution events from RabbitMQ and forward them to the webhook handler."

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.EVOLUTION_RABBITMQ_URL:
            raise CommandError("EVOLUTION_RABBITMQ_URL is not set: the RabbitMQ channel is off")
        per_instance = settings.EVOLUTION_RABBITMQ_PER_INSTANCE
        names = (instance_names_from_db() or []) if per_instance else []
        freeze_startup_objects()
        # confirm_publish: a copy moved to a delay or parking queue is confirmed by the broker
        # before the original is acked.
        with Connection(
            settings.EVOLUTION_RABBITMQ_URL, heartbeat=30, transport_options={"confirm_publish": True}
        ) as connection:
            worker = EvolutionConsumer(
                connection, topology(names), instance_source=instance_names_from_db if per_instance else None
            )

            def stop(signum: int, frame: Any) -> None:
                # Finish the current message, then leave (hc on_signal).
                worker.should_stop = True

            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
            log.info(
                "consumer started: queue %s bound to %s (%s mode)",
                worker.topology.work.name,
                ", ".join(exchange_names(names)),
                "per-instance" if per_instance else "global",
            )
            worker.heartbeat = heartbeats.Process("consumer")
            worker.run()
            worker.heartbeat.forget()
        log.info("consumer stopped")
