"""Process-wide settings: CLI/env at start-up, changeable later through /_control/global."""

from __future__ import annotations

import copy
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from . import banmodel

DEFAULT_API_KEY = "BQYHJGJHJ"  # Evolution's code default for AUTHENTICATION_API_KEY
DEFAULT_EXCHANGE = "evolution_exchange"

# Evolution 2.3 WEBHOOK_RETRY_* defaults (env.config.ts).
DEFAULT_RETRY: dict[str, Any] = {
    "max_attempts": 10,
    "initial_delay_s": 5.0,
    "max_delay_s": 300.0,
    "jitter": 0.2,
    "exponential": True,
    "non_retryable_status_codes": [400, 401, 403, 404, 422],
}

# Delay of each receipt after the previous one (ms). Order matters: statuses are emitted in
# this order; a status mapped to None is skipped.
DEFAULT_ACK_DELAYS_MS: dict[str, float | None] = {"SERVER_ACK": 10, "DELIVERY_ACK": 20, "READ": 30}


def env_first(*names: str, default: str | None = None) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return default


@dataclass
class GlobalConfig:
    api_key: str = DEFAULT_API_KEY
    server_url: str = "http://localhost:8080"
    # Global webhook (WEBHOOK_GLOBAL_*); empty events list = every event.
    webhook_url: str | None = None
    by_events: bool = False
    webhook_events: list[str] = field(default_factory=list)
    webhook_retry: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_RETRY))
    webhook_timeout_s: float = 30.0
    # RabbitMQ (RABBITMQ_*). The URL is fixed at start-up; the rest can change.
    rabbitmq_url: str | None = None
    rabbitmq_global: bool = False
    rabbitmq_events: list[str] = field(default_factory=list)
    exchange: str = DEFAULT_EXCHANGE
    prefix: str = ""
    declare_queues: bool = True
    # Fake-WhatsApp behaviour.
    ack_delays_ms: dict[str, float | None] = field(default_factory=lambda: dict(DEFAULT_ACK_DELAYS_MS))
    auto_pair_ms: float | None = 1000.0
    max_stored_messages: int = 100_000  # messages kept for findMessages, all instances together
    # A gateway whose own CPU is the bottleneck (one Node event loop): every request to an Evolution route
    # holds it this long, one at a time, before its handler runs; 0 = served at once. Calls then queue
    # behind each other, as a busy Evolution's do (GET / too: that is what a caller's probe sees).
    service_ms: float = 0.0
    # What `GET /` answers: 200 with Evolution's welcome body, or this status with a 404-style error body, as a
    # proxy that serves Evolution under a path prefix (or another gateway version) answers its root.
    root_status: int = 200
    # The ban model (simulator/banmodel.py), off unless turned on; every one of its durations passes
    # `time_scale` times faster than real time.
    ban_model: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(banmodel.DEFAULTS))
    time_scale: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def copy(self) -> GlobalConfig:
        return copy.deepcopy(self)
