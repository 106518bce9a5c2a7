"""How big each scenario is: full (`make chaos`, ~15 min on 2 cores, R9's 10-minute outage and R11's two compressed
weeks) or smoke (tests/chaos).

Every size can be overridden with env CHAOS_<NAME> or `--set name=value`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Sizes:
    # R1: Redis outage under a steady send load
    r1_outage_s: float = 30.0
    r1_rate: float = 10.0  # sends per second during the whole window
    # R2: RabbitMQ outage
    r2_outage_s: float = 30.0
    r2_rate: float = 5.0
    r2_inflight: int = 40  # messages sent just before the outage, their receipts due during it
    # R3: Postgres outage
    r3_outage_s: float = 10.0
    r3_rate: float = 5.0
    # R4: lane worker SIGKILLed during a big batch
    r4_messages: int = 5000
    r4_kills: int = 10
    # R5: web restarted during a status-webhook storm
    r5_messages: int = 300
    r5_restarts: int = 3
    # R6: gateway matrix, messages per case; 5xx answers in a row (each costs a backoff: 5 s, 15 s, 45 s)
    r6_per_case: int = 3
    r6_burst: int = 3
    # R7: relay and consumer killed mid-batch
    r7_messages: int = 600
    r7_kills: int = 2
    # R8: sends with every fifth answer lost after the send and every fifth other one before; r8_events_lost=1 also
    # drops every Evolution event (webhook and RabbitMQ), so that no receipt settles a lost answer before the worker's
    # look-up does (receipts then come from status sync)
    r8_messages: int = 2000
    r8_events_lost: int = 0
    # R9: the callback receiver down (connection refused) this long while r9_messages sends go through;
    # bench B3's OTP stream at r9_otp_rate, idle first (r9_idle_otps after r9_warmup_otps), then all through the outage
    r9_down_seconds: float = 600.0
    r9_messages: int = 1000
    r9_otp_rate: float = 4.0
    r9_idle_otps: int = 240
    r9_warmup_otps: int = 16
    # R10: two of every scalable process; sends in all (C's two runs included), C's per run (more than the
    # stack's burst of 50, so that C's own pace bounds "C alone", as B's in bench B6), the pace of each of
    # A's instances and of C's one
    r10_messages: int = 5000
    r10_c_messages: int = 200
    r10_a_rate: float = 10.0
    r10_c_rate: float = 10.0
    # S1: schemathesis examples per operation
    s1_examples: int = 40
    # S6: unauthenticated junk requests against both pools, and the RSS growth each worker may show
    s6_requests: int = 5000
    s6_warmup: int = 250  # junk sent before the first reading (code loaded, first-use caches and arenas)
    s6_growth_mb: float = 10.0
    s6_webhook_workers: int = 2  # the webhook pool S6 and S7 start next to the stack (gthread, 4 threads)
    # S7: hypothesis examples per fuzz target (the login form gets a quarter: each try hashes a
    # password), the time the whole fuzz may take, and its seed
    s7_examples: int = 300
    s7_budget_s: float = 600.0
    s7_seed: int = 8
    # S8: TEST sends to the READ number per round (C alone, A into the tarpit, C beside it); how long the silent
    # name server's lookups go on, and how many threads look up at once
    s8_messages: int = 20
    s8_dns_seconds: float = 30.0
    s8_attackers: int = 4
    # R11: a new unofficial number's MARKETING campaign to as many cold contacts, its deadline this many compressed
    # days away, time running r11_time_scale times as fast in the product's policy and the simulator's ban model
    r11_messages: int = 2000
    r11_days: float = 7.0
    r11_time_scale: float = 2000.0
    # How long a scenario waits for every accepted message to reach a final state
    drain_s: float = 240.0
    senders: int = 8  # client threads posting sends


SMOKE = Sizes(
    r1_outage_s=3.0, r1_rate=5.0,
    r2_outage_s=3.0, r2_rate=3.0, r2_inflight=8,
    r3_outage_s=3.0, r3_rate=3.0,
    r4_messages=120, r4_kills=2,
    r5_messages=30, r5_restarts=1,
    r6_per_case=1, r6_burst=2,
    r7_messages=40, r7_kills=1,
    r8_messages=40,
    r9_down_seconds=5.0, r9_messages=20, r9_otp_rate=10.0, r9_idle_otps=40, r9_warmup_otps=4,
    r10_messages=300, r10_c_messages=70, r10_a_rate=5.0, r10_c_rate=5.0,
    r11_messages=60, r11_days=2.0, r11_time_scale=5000.0,
    s1_examples=5,
    s6_requests=300, s6_warmup=100,
    s7_examples=12, s7_budget_s=120.0,
    s8_messages=6, s8_dns_seconds=8.0, s8_attackers=2,
    drain_s=120.0, senders=4,
)


def _coerce(current: object, raw: str) -> object:
    return type(current)(raw)


def resolve(smoke: bool, overrides: list[str] | None = None, env: dict[str, str] | None = None) -> Sizes:
    sizes = SMOKE if smoke else Sizes()
    env = dict(os.environ if env is None else env)
    changes: dict[str, object] = {}
    for f in fields(Sizes):
        raw = env.get(f"CHAOS_{f.name.upper()}")
        if raw:
            changes[f.name] = _coerce(getattr(sizes, f.name), raw)
    for item in overrides or []:
        name, _, raw = item.partition("=")
        if name not in {f.name for f in fields(Sizes)}:
            raise SystemExit(f"--set: unknown size {name!r}")
        changes[name] = _coerce(getattr(sizes, name), raw)
    return replace(sizes, **changes)
