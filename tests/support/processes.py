"""Start and stop the real processes tests run against: the simulator and the product's stack."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from django.conf import settings

from pilot_status import topology
from pilot_status.lane_worker import LaneWorker
from pilot_status.lane_worker import settings_for as lane_worker_settings

from .simulator import SimulatorClient
from .workers import port_block, worker_id

ROOT = Path(__file__).resolve().parents[2]
# One folder per xdist worker: the processes' log names (web.log, worker-otp.log, ...) are the same in each.
LOG_DIR = Path(os.environ.get("PS_TEST_LOG_DIR") or ROOT / "artifacts" / "logs") / worker_id()
LANES = ("otp", "utility", "marketing")
# The maintenance queues (pilot_status/celery.py), each with its own worker in the Procfile.
MAINTENANCE_QUEUES = ("maintenance", "sync", "bulk")
CALLBACKS_QUEUE = "callbacks"
CALLBACKS_RELAY_QUEUE = "callbacks_relay"
# Every queue a beat entry goes to (pilot_status/celery.py): start_maintenance serves them all.
BEAT_QUEUES = (*MAINTENANCE_QUEUES, CALLBACKS_QUEUE, CALLBACKS_RELAY_QUEUE)


_ports = itertools.cycle(port_block())


def free_port() -> int:
    """A port nothing listens on, from this worker's block (tests/support/workers.py), next after the last one
    handed out: a process just stopped leaves its port a while before it is handed out again."""
    block = port_block()
    for _ in range(len(block)):
        port = next(_ports)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or still closing
            return port
    raise RuntimeError(f"no free port in {block.start}-{block.stop - 1} (tests/support/workers.py)")


def wait_for_port(port: int, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def wait_for_log(path: Path, needle: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None,
                 start_at: int = 0) -> None:
    """Wait for `needle` in the log, looking only past byte `start_at` (logs are appended to)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{path.name}: exited with {proc.returncode}:\n{path.read_text()[-3000:]}")
        if path.exists() and needle in path.read_bytes()[start_at:].decode(errors="replace"):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{path.name}: no {needle!r} after {timeout}s:\n{path.read_text()[-3000:] if path.exists() else ''}")


class Process:
    def __init__(self, name: str, argv: list[str], env: dict[str, str]):
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.argv = argv
        self.env = env
        self.log = LOG_DIR / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "Process":
        handle = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.argv, cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=15)

    def stop(self, timeout: float = 10.0) -> None:
        stop_all([self], timeout)


def stop_all(processes: Iterable[Process], timeout: float = 10.0) -> None:
    """SIGTERM to every running one of `processes` first, then wait for each (SIGKILL after `timeout`): the
    bench's way (bench.launcher.stop_together), for the test stack's processes."""
    from bench.launcher import stop_together

    stop_together(list(processes), timeout)


def simulator_site(port: int, *extra: str) -> topology.Site:
    """The simulator's arguments under test: the test settings' key, exchange and broker, no preloaded
    instances (each test adds its own), and `extra` (e.g. chaos's --no-declare-queues)."""
    args = ["--api-key", settings.EVOLUTION_API_KEY, "--exchange", settings.EVOLUTION_RABBITMQ_EXCHANGE, *extra]
    if settings.EVOLUTION_RABBITMQ_URL:
        args += ["--rabbitmq-url", settings.EVOLUTION_RABBITMQ_URL]
    return topology.stack_site(0, simulator_port=str(port), simulator_args=tuple(args))


def start_simulator(port: int | None = None) -> SimulatorClient:
    port = port or free_port()
    env = dict(os.environ)
    argv = topology.process("simulator").command(simulator_site(port))
    process = Process(f"simulator-{port}", argv, env).start()
    wait_for_port(port, proc=process.proc)
    return SimulatorClient(f"http://127.0.0.1:{port}", process)


def test_database_url() -> str:
    parsed = urlparse(settings.DATABASE_URL)
    return urlunparse(parsed._replace(path="/" + settings.DATABASES["default"]["NAME"]))


class Stack:
    """gunicorn + relay + one Celery worker per lane, all on the test database.

    One gunicorn pool serves both the client API and the webhook (`webhook_url` is on `web`): the
    single-process deployment, which must keep working. `make run` and the bench split them into
    the Procfile's `web` and `webhook` pools; only the routing differs, the app is the same.
    """

    def __init__(self, simulator: SimulatorClient, web_workers: int = 2):
        self.simulator = simulator
        self.port = free_port()
        self.web_url = f"http://127.0.0.1:{self.port}"
        self.webhook_url = f"{self.web_url}/api/internal/webhook"
        self.env = dict(os.environ)
        self.env.update(
            {
                "DATABASE_URL": test_database_url(),
                "EVOLUTION_API_URL": simulator.base_url,
                "PORT": str(self.port),
                "INTERNAL_WEBHOOK_URL": self.webhook_url,
                "RELAY_POLL_SECONDS": "0.5",
                # The test process TRUNCATEs between tests while these processes run: they must be
                # the ones to give up on a lock (and retry), never the flush (a deadlock otherwise).
                "DATABASE_LOCK_TIMEOUT_MS": "300",
                "PYTHONUNBUFFERED": "1",
                # prometheus_client's multiprocess mode, as under `make run`: every process of this stack
                # writes its histograms here, and /metrics on its web merges them (pilot_status/observe.py).
                "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix="ps-prometheus-"),
            }
        )
        self.web_workers = web_workers
        self.processes: dict[str, Process] = {}

    def site(self) -> topology.Site:
        """What this stack fills into the topology's commands (pilot_status/topology.py): this interpreter,
        its port, `<queue>@test` node names; no access log (the tests read the logs for what they check)."""
        return topology.stack_site(self.port, web_workers=self.web_workers, node="test", access_log=())

    def _web(self) -> Process:
        return Process("web", topology.process("web").command(self.site()), self.env)

    def _relay(self) -> Process:
        # The single-pool deployment: one relay for every lane.
        return Process("relay", topology.RELAY_ALL_LANES.command(self.site()), self.env)

    def _consumer(self) -> Process:
        return Process("consumer", topology.process("consumer").command(self.site()), self.env)

    def lane_worker(self, lane: str) -> LaneWorker:
        """The pool and concurrency a lane's worker runs with: the Procfile's (pilot_status.lane_worker)."""
        return lane_worker_settings(lane, self.env)

    def _worker(self, lane: str) -> Process:
        worker = self.lane_worker(lane)
        return Process(f"worker-{lane}", topology.lane_worker_command(worker, self.site()), {**self.env, **worker.env()})

    def _maintenance_worker(self, queue: str, env: dict[str, str]) -> Process:
        return Process(f"worker-{queue}", topology.process(f"worker_{queue}").command(self.site()), env)

    def _beat(self, env: dict[str, str]) -> Process:
        return Process("beat", topology.process("beat").command(self.site()), env)

    def start_maintenance(self, periods: dict[str, str]) -> None:
        """Beat (the DatabaseScheduler, as in the Procfile) and the maintenance workers, with the beat
        periods given as environment variables (e.g. {"RECONCILE_SECONDS": "1"}). Not part of
        start(): most tests run the one-pass functions themselves, at the moment they choose."""
        env = {**self.env, **periods}
        offsets = {}
        for queue in BEAT_QUEUES:
            worker = self._maintenance_worker(queue, env)
            offsets[queue] = log_size(worker.log)
            self.processes[f"worker-{queue}"] = worker.start()
        self.processes["beat"] = self._beat(env).start()
        try:
            for queue in BEAT_QUEUES:
                worker = self.processes[f"worker-{queue}"]
                wait_for_log(worker.log, "ready.", proc=worker.proc, start_at=offsets[queue])
        except BaseException:
            self.stop_maintenance()
            raise

    def start_callbacks(self, settings_env: dict[str, str]) -> None:
        """The Procfile's worker_callbacks (threads pool), worker_callbacks_relay and beat, whose
        relay-callbacks entry runs the relay pass; settings_env shortens the periods and the retry schedule
        for a test."""
        env = {**self.env, **settings_env}
        offsets = {}
        for queue in (CALLBACKS_QUEUE, CALLBACKS_RELAY_QUEUE):
            worker = self._maintenance_worker(queue, env)
            offsets[queue] = log_size(worker.log)
            self.processes[f"worker-{queue}"] = worker.start()
        self.processes["beat"] = self._beat(env).start()
        try:
            for queue in (CALLBACKS_QUEUE, CALLBACKS_RELAY_QUEUE):
                worker = self.processes[f"worker-{queue}"]
                wait_for_log(worker.log, "ready.", proc=worker.proc, start_at=offsets[queue])
        except BaseException:
            self.stop_callbacks()
            raise

    def stop_callbacks(self) -> None:
        self._stop_named(("beat", f"worker-{CALLBACKS_QUEUE}", f"worker-{CALLBACKS_RELAY_QUEUE}"))

    def stop_maintenance(self) -> None:
        self._stop_named(("beat", *(f"worker-{queue}" for queue in BEAT_QUEUES)))

    def _stop_named(self, names: Iterable[str]) -> None:
        stop_all([process for process in (self.processes.pop(name, None) for name in names) if process is not None])

    def start(self) -> None:
        self.purge_queues()  # leftovers of an earlier run must not reach this run's database
        self.processes = {"web": self._web(), "relay": self._relay(), "consumer": self._consumer()}
        for lane in LANES:
            self.processes[f"worker-{lane}"] = self._worker(lane)
        try:
            for process in self.processes.values():
                process.start()
            wait_for_port(self.port, proc=self.processes["web"].proc)
            for lane in LANES:
                worker = self.processes[f"worker-{lane}"]
                wait_for_log(worker.log, "ready.", proc=worker.proc)
            consumer = self.processes["consumer"]
            wait_for_log(consumer.log, "Connected to amqp", proc=consumer.proc)
        except BaseException:
            # The fixture never reaches its stop() when start() raises: the processes that did start
            # would outlive the test and take the next test's (or the next checkout's) messages.
            self.stop()
            raise

    def restart(self, name: str, sig: int = signal.SIGTERM) -> None:
        process = self.processes[name]
        if sig == signal.SIGKILL:
            process.kill()
        else:
            process.stop()
        fresh = {"web": self._web, "relay": self._relay, "consumer": self._consumer}.get(name) or (lambda: self._worker(name.split("-", 1)[1]))
        offset = log_size(process.log)
        self.processes[name] = fresh().start()
        if name == "web":
            wait_for_port(self.port, proc=self.processes[name].proc)
        if name == "consumer":
            wait_for_log(process.log, "Connected to amqp", proc=self.processes[name].proc, start_at=offset)

    def wait_until_quiet(self, timeout: float = 10.0) -> None:
        """Stop feeding work (outbox emptied, lane queues purged), then wait until no message is
        being sent (best effort): a test may end with a backlog still draining."""
        from django.utils import timezone

        from messaging.models import Message, OutboxEntry

        try:
            OutboxEntry.objects.all().delete()
        except Exception:
            return
        self.purge_queues()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                busy = (
                    OutboxEntry.objects.filter(available_at__lte=timezone.now()).exists()
                    or Message.objects.filter(status="SENDING").exists()
                )
            except Exception:
                return
            if not busy:
                time.sleep(0.2)  # let the last receipts land
                return
            time.sleep(0.1)

    def purge_queues(self) -> None:
        from pilot_status.celery import app

        from ingestion.consumer import RETRY_DELAYS_S, queue_names

        ingest = queue_names()
        # The consumer's delay and parking queues too: a message left waiting there by one test
        # would come back in the next one.
        queues = LANES + MAINTENANCE_QUEUES + (CALLBACKS_QUEUE, CALLBACKS_RELAY_QUEUE, ingest.work, *(ingest.retry(d) for d in RETRY_DELAYS_S), ingest.parking)
        with app.connection_for_write() as conn:
            for queue in queues:
                channel = conn.channel()  # a missing queue closes its channel: one each
                try:
                    channel.queue_purge(queue)
                except Exception:
                    pass
                finally:
                    try:
                        channel.close()
                    except Exception:
                        pass

    def stop(self) -> None:
        stop_all(self.processes.values())
        shutil.rmtree(self.env["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
