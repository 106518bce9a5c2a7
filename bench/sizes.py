"""Sizes of every scenario: defaults for the full run, tiny ones for the smoke test.

Each field can be set by environment (BENCH_<FIELD>, e.g. BENCH_B2_MESSAGES=5000) or on the command
line (`python -m bench --set b2_messages=5000`); the command line wins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Sizes:
    runs: int = 2                   # repetitions of each figure (median, min, max)
    fleet: int = 60                 # project A's instances (each paced at SEND_RATE_PER_INSTANCE)
    b1_runs: int = 4                # B1 moves most with the host's phases: more interleaved runs for its median
    b1_seconds: float = 8.0         # length of one wrk run
    b1_connections: int = 16
    b2_messages: int = 2_000        # issue 7 names 20,000: --set b2_messages=20000 (about 10 min a run here; the 15-min budget)
    b2_runs: int = 3                # B2o's pairs: the median of three, so that one stalled pair does not decide it
    b2_otp_rate: float = 20.0       # issue 25 §3: another tenant's OTPs per second beside each B2 run (0: none)
    b2_otp_alone_seconds: float = 15.0  # the OTP stream alone between the two runs of a pair (its CPU per OTP)
    b3_backlog: int = 50_000
    b3_otps: int = 240              # OTPs in each measured stream (the p99 is taken on every run's together)
    b3_otp_rate: float = 8.0        # OTPs per second
    b3_warmup_otps: int = 16        # sent first in every stream, not measured
    # 1: a message.status endpoint for every message of project A (issue 23: callbacks must never slow an OTP);
    # 0: off, to compare.
    b3_callbacks: int = 1
    b4_messages: int = 5_000
    b4_instances: int = 5           # the queued messages are spread over this many of A's instances
    b4_outage_seconds: float = 60.0
    b4_drain_timeout: float = 200.0
    b5_events: int = 20_000         # as issue 7 names it; 4,000 read 0.1-0.25x lower (start-up and tail weigh more)
    b5_runs: int = 3                # likewise: one pass at half rate (263 against 532 events/s) decided a median of two
    b5_pending: int = 300           # the next batch of events is asked for once at most this many webhooks are pending
    b5_batch: int = 100             # events per control call to the simulator
    b6_backlog: int = 50_000
    b6_runs: int = 2
    b6_b_messages: int = 500
    b6_delay_seconds: float = 2.0   # how much "later" project B queues
    b6_timeout: float = 60.0        # B's wait is reported as "> timeout" past this
    # Messages whose status changes (about three callbacks each: SENT, DELIVERED, READ) are delivered from a backlog.
    b7_messages: int = 2_000
    b7_runs: int = 2
    b8_messages: int = 5_000        # UTILITY messages queued over b8_instances (more than a window can send)
    b8_instances: int = 5
    b8_seconds: float = 30.0        # the measured window of each run (the old pool would take hours for 5,000 at 3 s)
    b8_latencies: str = "0.2,1,3"   # the simulator's latency fault, seconds
    b8_pools: str = "prefork,threads"
    b8_otp_rate: float = 10.0       # the OTP stream alongside, per second
    # B9: unofficial numbers at a compressed human pace (bench/scenarios/b9_human_pace.py). At scale 10 a gap of
    # 300-500 policy s is 30-50 s real: about 25 sends/s from 1,000 numbers (at 40/s the stack alone took 1.7 of
    # the 2 cores).
    b9_numbers: int = 1_000
    b9_time_scale: float = 10.0     # SENDING_POLICY_TIME_SCALE of the paced processes during B9
    b9_gap_min: float = 300.0       # each number's gap_min_seconds / gap_max_seconds (policy seconds)
    b9_gap_max: float = 500.0
    b9_recipients: int = 7          # warm recipients of every number (coprime with b9_numbers: each gets all)
    b9_lead_seconds: float = 15.0   # the first slots begin this long after the schedules are written
    b9_warmup_seconds: float = 55.0  # after the first slots begin, before the window: every number sent once
    b9_seconds: float = 240.0       # the measured window
    b9_tail_seconds: float = 5.0    # waited after the window before reading what was sent
    b9_tail_margin: float = 3.0     # slots this close to the window's end are not judged for lateness
    b9_idle_seconds: float = 10.0   # the stack's CPU with nothing to send, measured first
    b9_b2_messages: int = 2_000     # B2's pipeline before and after, for the CPU per message baseline
    b9_same_rate_seconds: float = 60.0  # B2's pipeline fed at B9's rate: its measured window
    b9_same_rate_warmup: float = 10.0   # and the seconds it runs before the window
    wait_timeout: float = 300.0     # any other wait (all SENT, all READ, all applied)
    profile_seconds: float = 5.0    # py-spy sampling window; 0 = no profiling


SMOKE = Sizes(
    runs=1, b1_runs=1, fleet=3, b4_instances=2, b6_runs=1, b1_seconds=2, b1_connections=4, b2_messages=20, b2_runs=1, b2_otp_rate=5, b2_otp_alone_seconds=2, b3_backlog=20, b3_otps=5, b3_warmup_otps=2,
    b3_otp_rate=20, b4_messages=20, b4_outage_seconds=2, b4_drain_timeout=60, b5_events=20, b5_runs=1,
    b6_backlog=20, b6_b_messages=5, b6_delay_seconds=0.2, b6_timeout=30, wait_timeout=60, profile_seconds=0,
    b7_messages=20, b7_runs=1, b8_messages=200, b8_seconds=10, b8_latencies="1", b8_otp_rate=4,
    b9_numbers=5, b9_gap_min=20, b9_gap_max=40, b9_lead_seconds=3, b9_warmup_seconds=5, b9_seconds=15,
    b9_tail_seconds=2, b9_tail_margin=1, b9_idle_seconds=2, b9_b2_messages=20,
    b9_same_rate_seconds=3, b9_same_rate_warmup=1,
)


def _coerce(kind: type, raw: str) -> object:
    return kind(float(raw)) if kind is int else kind(raw)


def resolve(smoke: bool = False, overrides: list[str] | None = None, env: dict[str, str] | None = None) -> Sizes:
    env = dict(os.environ if env is None else env)
    sizes = SMOKE if smoke else Sizes()
    types = {f.name: type(getattr(sizes, f.name)) for f in fields(sizes)}
    changes: dict[str, object] = {}
    for name, kind in types.items():
        raw = env.get(f"BENCH_{name.upper()}")
        if raw:
            changes[name] = _coerce(kind, raw)
    for item in overrides or []:
        name, _, raw = item.partition("=")
        if name not in types:
            raise SystemExit(f"--set {item}: unknown size {name!r}; known: {', '.join(types)}")
        changes[name] = _coerce(types[name], raw)
    return replace(sizes, **changes)  # type: ignore[arg-type]
