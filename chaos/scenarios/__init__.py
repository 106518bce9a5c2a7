"""One module per scenario; each `run(ctx)` returns {"passed", "figures", "notes"} for the report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import (
    r1_redis, r2_rabbitmq, r3_postgres, r4_worker_kills, r5_web_restart, r6_gateway, r7_relay_consumer,
    r8_lost_answers, r9_callbacks_down, r10_scale_out, r11_campaign,
    s1_schema, s2_tenants, s3_webhook_auth, s4_bad_input, s5_secrets, s6_amplification, s7_fuzz, s8_callback_bounds,
)

PLAN: dict[str, Callable[[Any], dict[str, Any]]] = {
    "R1": r1_redis.run, "R2": r2_rabbitmq.run, "R3": r3_postgres.run, "R4": r4_worker_kills.run,
    "R5": r5_web_restart.run, "R6": r6_gateway.run, "R7": r7_relay_consumer.run,
    "R8": r8_lost_answers.run, "R8I": r8_lost_answers.run_ignoring_ids, "R9": r9_callbacks_down.run, "R10": r10_scale_out.run, "R11": r11_campaign.run,
    "S1": s1_schema.run, "S2": s2_tenants.run, "S3": s3_webhook_auth.run, "S4": s4_bad_input.run,
    "S5": s5_secrets.run, "S6": s6_amplification.run, "S7": s7_fuzz.run, "S8": s8_callback_bounds.run,
}
