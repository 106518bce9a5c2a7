"""Start a lane worker (otp / utility / marketing): `python -m pilot_status.lane_worker LANE [celery args]`.

The one place that says how a lane worker runs, so that the Procfile, docker-compose, the test stack,
the bench and chaos all start the same thing (issue 26).

A send spends almost all its time waiting on Evolution, which answers only once WhatsApp took the
message (0.3-3 s, plus the typing delay it is asked to show). With Celery's prefork pool each wait
held a whole process, so a lane sent at most `processes / latency` messages per second whatever the
instances' pacing caps (2 processes at 1 s: 2 msg/s). The lanes run Celery's **threads** pool
instead: the sync Django code stays as it is, a thread waiting on a socket leaves the CPU to the
others, and the lane's concurrency is set from what it waits on, not from cores.

How many threads: one instance keeps at most `rate × (latency + typing) + burst` calls in flight
(its send slot meters the calls: sending.pacing), 20/s × (1 s + 2.4 s of typing) + 10 ≈ 78 at the
defaults for an 80-character text, and a lane process sends at most `threads / (latency + typing)`
per second. So utility and marketing run 384 threads: five instances at their full cap (100/s) at
up to about 0.4 s of latency, or 113/s at 1 s, which is above what two cores can drive anyway (bench
B8 measures that ceiling); run more lane processes, on more machines, for more. otp runs 64: an OTP
types 0.3 s, so 64 threads carry a 19 OTP/s stream even at 3 s of latency. A waiting thread costs
memory (its stack, a keep-alive socket to Evolution), not CPU; B8 reports the peak RSS.

Database connections do not grow with the threads: a threads-pool worker shares a pool of
`LANE_WORKER_DB_CONNECTIONS` (8) Postgres connections among them (Django's psycopg pool, set through
DATABASE_POOL_MAX_SIZE), and a thread gives its connection back while it waits on Evolution or for
its send slot (pilot_status.database.release_while_waiting). The three lanes hold at most 24
connections, the whole Procfile about 50, against Postgres's max_connections 200
(scripts/services.sh, docker-compose.yml). The prefork pool keeps one persistent connection per
process, as before.

Settings (environment, read here and nowhere else):
- LANE_WORKER_POOL: `threads` (default) or `prefork` (the old pool, kept for side-by-side benches);
- LANE_WORKER_CONCURRENCY_<LANE> (e.g. LANE_WORKER_CONCURRENCY_UTILITY): that lane's concurrency;
- LANE_WORKER_CONCURRENCY: every lane's, where the lane's own is unset;
- LANE_WORKER_DB_CONNECTIONS: the threads pool's shared Postgres connections per lane process (8).
Under prefork the defaults are the old ones (2 processes), since each is a process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

LANES = ("otp", "utility", "marketing")
POOLS = ("threads", "prefork")
DEFAULT_POOL = "threads"
DEFAULT_CONCURRENCY = {"threads": {"otp": 64, "utility": 384, "marketing": 384},
                       "prefork": {"otp": 2, "utility": 2, "marketing": 2}}
# Postgres connections a threads-pool lane worker shares among its threads (DATABASE_POOL_MAX_SIZE).
DEFAULT_DB_CONNECTIONS = 8
MAX_DB_CONNECTIONS = 64
# Threads share the pool's connections, so a thread costs memory only; a number above this is a typo, not a plan.
MAX_CONCURRENCY = 1024
USAGE = "usage: python -m pilot_status.lane_worker {otp,utility,marketing} [extra celery worker args]"


@dataclass(frozen=True)
class LaneWorker:
    lane: str
    pool: str
    concurrency: int
    db_connections: int = 0  # the process's connection pool; 0: one persistent connection per thread/process

    def env(self) -> dict[str, str]:
        """What the worker needs in its environment besides its arguments."""
        return {"DATABASE_POOL_MAX_SIZE": str(self.db_connections)} if self.db_connections else {}

    def celery_args(self, app: str = "pilot_status", hostname: str | None = None,
                    log_level: str = "info") -> list[str]:
        """`celery …` arguments after the program name."""
        return [
            "-A", app, "worker", "-Q", self.lane, "-n", hostname or f"{self.lane}@%h",
            "-P", self.pool, "-c", str(self.concurrency),
            # One task per thread/process at a time: a reserved task waits for nobody in particular.
            "--prefetch-multiplier", "1",
            *(["-O", "fair"] if self.pool == "prefork" else []),
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", log_level,
        ]


def settings_for(lane: str, env: Mapping[str, str] | None = None) -> LaneWorker:
    """The pool and concurrency `lane`'s worker runs with; ValueError naming the variable when bad."""
    env = os.environ if env is None else env
    if lane not in LANES:
        raise ValueError(f"no lane {lane!r} (one of {', '.join(LANES)})")
    pool = (env.get("LANE_WORKER_POOL") or DEFAULT_POOL).strip()
    if pool not in POOLS:
        raise ValueError(f"LANE_WORKER_POOL must be one of {', '.join(POOLS)}, got {pool!r}")
    concurrency = DEFAULT_CONCURRENCY[pool][lane]
    for name in (f"LANE_WORKER_CONCURRENCY_{lane.upper()}", "LANE_WORKER_CONCURRENCY"):
        raw = (env.get(name) or "").strip()
        if raw:
            if not raw.isdigit() or not 1 <= int(raw) <= MAX_CONCURRENCY:
                raise ValueError(f"{name} must be a whole number from 1 to {MAX_CONCURRENCY}, got {raw!r}")
            concurrency = int(raw)
            break
    db_connections = 0
    if pool == "threads":
        raw = (env.get("LANE_WORKER_DB_CONNECTIONS") or "").strip()
        if raw and (not raw.isdigit() or not 1 <= int(raw) <= MAX_DB_CONNECTIONS):
            raise ValueError(f"LANE_WORKER_DB_CONNECTIONS must be a whole number from 1 to {MAX_DB_CONNECTIONS}, got {raw!r}")
        db_connections = int(raw) if raw else DEFAULT_DB_CONNECTIONS
    return LaneWorker(lane, pool, concurrency, db_connections)


def main(argv: list[str]) -> int:
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        worker = settings_for(argv[0])
    except ValueError as exc:
        print(f"pilot_status.lane_worker: {exc}\n{USAGE}", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "celery", *worker.celery_args(), *argv[1:]]
    os.environ.update(worker.env())
    os.execv(sys.executable, command)
    return 0  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
