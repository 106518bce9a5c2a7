"""Start the real stack for the bench: simulator, gunicorn (web + webhook pools), relay, consumer, one
Celery worker per lane, and the callbacks worker (B3 turns callbacks on; bench.callbacks_on).

Shaped like production (the Procfile's two gunicorn pools, one worker pool per lane) rather than like the
test fixture, and every process runs with bench.settings so the baseline view and task are loaded too.
The simulator posts its webhooks to the webhook pool and the consumer forwards there (as in `make run`);
the client API and the bare baseline view stay on the web pool.
Each process gets its own session so it can be stopped (and only it) by its process group.
Every command comes from the process topology (pilot_status/topology.py), as the Procfile's and compose's do;
this module fills in only its ports, node names (`<queue>@bench`), Celery app (bench.celery_app), logs and
environment. Priorities are the deployment's, as `make run` sets them: every process of ours starts through
scripts/launch.sh (the Procfile's launcher), the background ones at BACKGROUND_NICE (default 10) and, where systemd
lets it, in the bulk slice. BENCH_NICE=name=N,... sets chosen processes' nice instead, and
BENCH_WORKER_ARGS_<LANE> adds Celery flags to one lane's worker (e.g. "--pool threads -c 4"): knobs to compare.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pilot_status.lane_worker import LaneWorker
    from pilot_status.topology import Site

# pilot_status (topology, lane_worker) is imported inside the functions: importing it loads the
# Celery app, which reads Django's settings, and the bench process must choose its settings module
# (bench.settings) before anything does.

ROOT = Path(__file__).resolve().parents[1]
LANES = ("otp", "utility", "marketing")
# Every process BenchStack.start starts.
STARTED = ("simulator", "web", "webhook", "relay", "relay-otp", "consumer", *(f"worker-{lane}" for lane in LANES),
           "worker-callbacks", "worker-callbacks-relay")


def background_processes() -> set[str]:
    """The topology's processes that run at the background priority, by their names here (`_` → `-`)."""
    from pilot_status import topology

    return topology.background_services()


def launcher_description() -> str:
    """What the launcher does on this host (nice, and systemd slices or none): the page says how the priorities
    were set."""
    done = subprocess.run([str(ROOT / "scripts" / "launch.sh"), "--describe"], capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def priorities(env: dict[str, str]) -> dict[str, int]:
    """Each process's nice: the Procfile's background ones at BACKGROUND_NICE, then BENCH_NICE's overrides."""
    from pilot_status.topology import DEFAULT_BACKGROUND_NICE

    background = int(env.get("BACKGROUND_NICE") or DEFAULT_BACKGROUND_NICE)
    nice = {name: background for name in background_processes()}
    nice.update({name: int(value) for name, _, value in
                 (pair.partition("=") for pair in env.get("BENCH_NICE", "").split(",") if pair)})
    return nice


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def wait_for_log(path: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float = 45.0, offset: int = 0) -> None:
    """Wait for `needle` in the log after byte `offset` (logs are appended across restarts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{path.name} exited with {proc.returncode}:\n{path.read_text(errors='replace')[-3000:]}")
        if path.exists() and needle in path.read_bytes()[offset:].decode(errors="replace"):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{path.name}: no {needle!r} after {timeout}s")


@dataclass
class Process:
    name: str
    kind: str  # web / webhook / worker / relay / consumer / simulator: the rows of the M figure
    argv: list[str]
    env: dict[str, str]
    log: Path
    ready_line: str | None = None  # what the process logs once it serves
    proc: subprocess.Popen[bytes] | None = None
    offset: int = 0

    def start(self) -> Process:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as handle:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self) -> None:
        if self.ready_line is not None:
            assert self.proc is not None
            wait_for_log(self.log, self.ready_line, self.proc, offset=self.offset)

    def stop(self, timeout: float = 15.0) -> None:
        stop_together([self], timeout)


def stop_together(processes: list[Any], timeout: float = 15.0) -> None:
    """SIGTERM to every running one of `processes` (anything with a `proc`: a Popen or None) first, then wait for
    each (SIGKILL after `timeout`).

    Each Celery worker's warm shutdown takes its time (it took up to 10 s before pilot_status.celery's
    STOP_CHECK_SECONDS): one after another, a stack's four workers took about 30 s to stop, together about 10.
    """
    running = [p for p in processes if p.proc is not None and p.proc.poll() is None]
    for process in running:
        assert process.proc is not None
        os.killpg(process.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in running:
        assert process.proc is not None
        try:
            process.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.proc.pid, signal.SIGKILL)
            process.proc.wait(timeout=5)


def _webhook_pool() -> list[str]:
    """The topology's webhook pool flags: `-w N` first, then the worker class and threads."""
    from pilot_status.topology import Site

    pool = list(Site.webhook_pool)
    assert pool[0] == "-w", pool
    return pool


@dataclass
class StackConfig:
    database_url: str
    web_workers: int = 2  # __main__ passes WEB_CONCURRENCY (one per core), as the Procfile
    # None: each lane's own (pilot_status.lane_worker, as in the Procfile); a number sets every lane's.
    worker_concurrency: int | None = None
    worker_pool: str | None = None  # None: LANE_WORKER_POOL's (threads); "prefork" for the old pool
    worker_log_level: str = "info"
    web_args: list[str] = field(default_factory=list)  # extra gunicorn flags, e.g. a worker class to compare
    # The webhook pool (the topology's `webhook`); BENCH_WEBHOOK_WORKERS / BENCH_WEBHOOK_ARGS to compare others.
    webhook_workers: int = field(default_factory=lambda: int(os.environ.get("BENCH_WEBHOOK_WORKERS") or _webhook_pool()[1]))
    webhook_args: list[str] = field(default_factory=lambda: (
        os.environ["BENCH_WEBHOOK_ARGS"].split() if "BENCH_WEBHOOK_ARGS" in os.environ else _webhook_pool()[2:]))
    log_dir: Path = ROOT / "artifacts" / "bench-logs"
    extra_env: dict[str, str] = field(default_factory=dict)


class BenchStack:
    def __init__(self, config: StackConfig):
        self.config = config
        self.sim_port = free_port()
        self.web_port = free_port()
        self.webhook_port = free_port()
        self.simulator_url = f"http://127.0.0.1:{self.sim_port}"
        self.web_url = f"http://127.0.0.1:{self.web_port}"
        # Where the simulator posts and the consumer forwards: the webhook pool, as in the Procfile.
        self.webhook_url = f"http://127.0.0.1:{self.webhook_port}/api/internal/webhook"
        env = dict(os.environ)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "bench.settings",
                "DATABASE_URL": config.database_url,
                "EVOLUTION_API_URL": self.simulator_url,
                "PORT": str(self.web_port),
                "WEBHOOK_PORT": str(self.webhook_port),
                "INTERNAL_WEBHOOK_URL": self.webhook_url,
                "PYTHONUNBUFFERED": "1",
                # The funnel's rate-limit check still runs (a Redis script per request); the bench
                # only lifts the limit so that measuring throughput is not measuring 429s.
                "RATE_LIMIT_PER_SECOND": "1000000",
                "RATE_LIMIT_BURST": "1000000",
                # Likewise the per-instance webhook limit (its default, 1,000/s, is already above
                # what B2 and B5 push through one instance; the check itself still runs).
                "WEBHOOK_RATE_PER_INSTANCE": "1000000",
                "WEBHOOK_RATE_BURST": "1000000",
                # B1-B6 measure the pipeline without the typing delay (on by default since issue 26);
                # B8 turns it on through extra_env.
                "TYPING_DELAY_MS_PER_CHAR": "0",
                "TYPING_DELAY_OTP_MS": "0",
                # B3's callbacks go to a receiver in the bench process, on loopback (bench.callbacks_on).
                "CALLBACKS_ALLOW_PRIVATE_ADDRESSES": "true",
                "PILOT_TEST_STACK": "1",  # production mode refuses the line above elsewhere (pilot_status/production.py)
            }
        )
        env.update(config.extra_env)
        self.env = env
        self.processes: dict[str, Process] = {}

    def site(self, port: int | None = None, web_workers: int | None = None) -> Site:
        """What the bench fills into the topology's commands (pilot_status/topology.py)."""
        from pilot_status import topology

        simulator_args = ["--api-key", self.env["EVOLUTION_API_KEY"],
                          "--exchange", self.env.get("EVOLUTION_RABBITMQ_EXCHANGE", "evolution_exchange"),
                          # Evolution's own per-event queues have no consumer here; filling them would only load RabbitMQ.
                          "--no-declare-queues"]
        if self.env.get("EVOLUTION_RABBITMQ_URL"):
            simulator_args += ["--rabbitmq-url", self.env["EVOLUTION_RABBITMQ_URL"]]
        return topology.stack_site(
            port or self.web_port, webhook_port=self.webhook_port, web_workers=web_workers or self.config.web_workers,
            node="bench", celery_app="bench.celery_app", log_level=self.config.worker_log_level,
            webhook_pool=("-w", str(self.config.webhook_workers), *self.config.webhook_args),
            simulator_port=str(self.sim_port), simulator_args=tuple(simulator_args),
        )

    def _process(self, name: str, kind: str, argv: list[str], ready_line: str | None = None,
                 launch_class: str | None = None) -> Process:
        """A process started through the launcher as `make run` starts it: its class, at its nice (BENCH_NICE may
        set one for any process, which then runs as background work)."""
        nice = priorities(dict(os.environ)).get(name, 0)
        # Its sessions carry its name in pg_stat_activity: a TRUNCATE that times out names who held the tables.
        env = {**self.env, "DATABASE_APPLICATION_NAME": name}
        if nice:
            launch_class = "bulk"
            env["BACKGROUND_NICE"] = str(nice)
        elif launch_class == "bulk":
            env["BACKGROUND_NICE"] = "0"
        if launch_class:
            argv = [str(ROOT / "scripts" / "launch.sh"), launch_class, *argv]
        return Process(name, kind, argv, env, self.config.log_dir / f"{name}.log", ready_line)

    def _described(self, name: str, kind: str, site: Site | None = None, extra: list[str] | None = None,
                   label: str | None = None) -> Process:
        """The topology's process `name` on this bench's site (or `site`), plus `extra` flags; `label` names
        it here (its log, its priority) when it is a second copy."""
        from pilot_status import topology

        described = topology.process(name)
        return self._process(label or name, kind, [*described.command(site or self.site()), *(extra or [])],
                             described.ready, described.launch_class)

    def simulator(self) -> Process:
        return self._described("simulator", "simulator")

    def web(self) -> Process:
        return self._described("web", "web", extra=self.config.web_args)

    def wide_web(self, workers: int) -> tuple[Process, str]:
        """A second client-API pool of another size, started and stopped by B1 only: its cross-check that the
        baseline is not measured at a pool size that suits the funnel better than the bare insert."""
        port = free_port()
        process = self._described("web", "web-wide", self.site(port, workers), self.config.web_args, label="web-wide").start()
        assert process.proc is not None
        wait_for_port(port, process.proc)
        return process, f"http://127.0.0.1:{port}"

    def webhook(self) -> Process:
        return self._described("webhook", "webhook")

    def relay(self) -> Process:
        # As in the Procfile: the OTP lane has a relay of its own (relay-otp).
        return self._described("relay", "relay")

    def relay_otp(self) -> Process:
        return self._described("relay-otp", "relay")

    def consumer(self) -> Process:
        return self._described("consumer", "consumer")

    def callbacks_worker(self) -> Process:
        """The `callbacks` queue's worker (the deliveries); no beat runs here, so the relay pass is published
        to worker-callbacks-relay by whoever turns callbacks on (bench.callbacks_on)."""
        return self._described("worker-callbacks", "callbacks")

    def callbacks_relay_worker(self) -> Process:
        """The `callbacks_relay` queue's worker: the relay pass, published here by bench.callbacks_on."""
        return self._described("worker-callbacks-relay", "callbacks")

    def lane_worker(self, lane: str, pool: str | None = None) -> LaneWorker:
        """What a lane's worker runs with: the Procfile's (pilot_status.lane_worker), unless this run (or
        `pool`, B8's side-by-side) says otherwise."""
        # Imported here: importing pilot_status loads the Celery app, which reads Django's settings, and
        # the bench process must choose its settings module (bench.settings) before anything does.
        from pilot_status.lane_worker import settings_for as lane_worker_settings

        env = dict(self.env)
        if pool or self.config.worker_pool:
            env["LANE_WORKER_POOL"] = pool or self.config.worker_pool or ""
        if self.config.worker_concurrency and not pool:
            env[f"LANE_WORKER_CONCURRENCY_{lane.upper()}"] = str(self.config.worker_concurrency)
        return lane_worker_settings(lane, env)

    def worker(self, lane: str, pool: str | None = None, env: dict[str, str] | None = None) -> Process:
        from pilot_status import topology

        settings = self.lane_worker(lane, pool)
        process = self._process(
            f"worker-{lane}", "worker",
            [*topology.lane_worker_command(settings, self.site()),
             *os.environ.get(f"BENCH_WORKER_ARGS_{lane.upper()}", "").split()],
            topology.process(f"worker_{lane}").ready, topology.process(f"worker_{lane}").launch_class,
        )
        process.env = {**process.env, **(env or {}), **settings.env()}
        return process

    def restart_lane_workers(self, pool: str | None = None, env: dict[str, str] | None = None) -> None:
        """Every lane worker again, on `pool` and with `env` on top of the stack's (B8: typing on, each pool in
        turn); without arguments, as the stack started them."""
        stop_together([self.processes[f"worker-{lane}"] for lane in LANES])
        for lane in LANES:
            self.processes[f"worker-{lane}"] = self.worker(lane, pool, env).start()
        for lane in LANES:
            self.processes[f"worker-{lane}"].wait_ready()

    def start(self) -> None:
        sim = self.simulator().start()
        self.processes["simulator"] = sim
        assert sim.proc is not None
        wait_for_port(self.sim_port, sim.proc)
        self.processes.update({"web": self.web(), "webhook": self.webhook(), "relay": self.relay(),
                               "relay-otp": self.relay_otp(), "consumer": self.consumer()})
        for lane in LANES:
            self.processes[f"worker-{lane}"] = self.worker(lane)
        self.processes["worker-callbacks"] = self.callbacks_worker()
        self.processes["worker-callbacks-relay"] = self.callbacks_relay_worker()
        assert tuple(self.processes) == STARTED
        for name, process in self.processes.items():
            if name != "simulator":
                process.start()
        for name, port in (("web", self.web_port), ("webhook", self.webhook_port)):
            pool = self.processes[name]
            assert pool.proc is not None
            wait_for_port(port, pool.proc)
        for process in self.processes.values():
            process.wait_ready()

    def stop_process(self, name: str) -> None:
        self.processes[name].stop()

    def start_process(self, name: str) -> None:
        factory = {"web": self.web, "webhook": self.webhook, "relay": self.relay, "relay-otp": self.relay_otp,
                   "consumer": self.consumer, "simulator": self.simulator,
                   "worker-callbacks": self.callbacks_worker,
                   "worker-callbacks-relay": self.callbacks_relay_worker}.get(name)
        process = (factory or (lambda: self.worker(name.split("-", 1)[1])))().start()
        self.processes[name] = process
        assert process.proc is not None
        if name == "simulator":
            wait_for_port(self.sim_port, process.proc)
        elif name in ("web", "webhook"):
            wait_for_port(self.web_port if name == "web" else self.webhook_port, process.proc)
        process.wait_ready()

    def revive(self) -> list[str]:
        """Start again any process that died (e.g. a service restart it did not survive); returns their names."""
        dead = [name for name, process in self.processes.items() if not process.alive()]
        for name in dead:
            self.start_process(name)
        return dead

    def stop(self) -> None:
        # The simulator last, as before: a worker's warm shutdown may still finish a send.
        stop_together([process for name, process in self.processes.items() if name != "simulator"])
        if "simulator" in self.processes:
            self.processes["simulator"].stop()
