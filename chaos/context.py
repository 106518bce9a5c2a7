"""What every scenario shares: the stack, the simulator, the proxy, the actors, sizes and helpers.

Maintenance (reconcilers, status sync, instance poll) runs *in the harness*: `Context.maintenance()`
calls the plain one-pass functions every `MAINTENANCE_EVERY_S` seconds, as beat would with shorter
periods, so that drains are not paced by beat's production schedule.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import requests

from .proxy import TcpProxy
from .sizes import Sizes
from .world import World, empty_tables

FINAL_OK = ("DELIVERED", "READ")
MAINTENANCE_EVERY_S = 2.0
# Receipts that end at DELIVERED: one webhook + one publish per send instead of three (big runs).
ACKS_DELIVERED = {"SERVER_ACK": None, "DELIVERY_ACK": 20, "READ": None}
ACKS_READ = {"SERVER_ACK": 5, "DELIVERY_ACK": 10, "READ": 15}


@dataclass
class Sent:
    status: int
    body: Any
    to: str = ""
    text: str = ""
    at: float = 0.0  # time.monotonic() when the answer came
    tries: int = 1  # >1: an earlier try got no answer (timeout, reset) and was retried with the same key

    @property
    def id(self) -> str | None:
        return self.body.get("id") if self.status == 202 and isinstance(self.body, dict) else None


@dataclass
class Context:
    stack: Any  # tests.support.processes.Stack
    sim: Any  # tests.support.simulator.SimulatorClient, direct (control API)
    proxy: TcpProxy | None
    world: World
    sizes: Sizes
    log: Callable[[str], None] = print
    maintenance_passes: int = 0
    maintenance_errors: int = 0
    _http: threading.local = field(default_factory=threading.local)

    # ---- set-up ---------------------------------------------------------------------------

    def fresh(self, acks: dict[str, Any] | None = None, empty: bool = True) -> None:
        """Empty the message tables and queues, reset the simulator, register every instance."""
        from messaging.models import Instance

        if self.proxy is not None:
            self.proxy.set_mode("pass")
        self._purge_queues()
        if empty:
            empty_tables()
        self.sim.reset()
        for instance in self.world.instances():
            self.register(instance, acks or ACKS_READ)
        Instance.objects.update(connection_state="open", last_gateway_error="")
        self.flush_redis()

    def _purge_queues(self, tries: int = 30) -> None:
        # Another engineer's fault test may be restarting the shared RabbitMQ: wait for it.
        for attempt in range(tries):
            try:
                self.stack.purge_queues()
                return
            except OSError:
                if attempt == tries - 1:
                    raise
                time.sleep(2)

    def register(self, instance: Any, acks: dict[str, Any]) -> None:
        self.sim.register(instance, self.stack.webhook_url, token=f"TOKEN-{instance.name}".upper())
        self.sim.faults(instance.name, ack_delays_ms=acks)

    @staticmethod
    def flush_redis() -> None:
        """Breakers, pacing buckets and cached instance states from an earlier scenario."""
        from django_redis import get_redis_connection

        with contextlib.suppress(Exception):
            get_redis_connection("default").flushdb()

    # ---- the client side ------------------------------------------------------------------

    def session(self) -> requests.Session:
        s = getattr(self._http, "s", None)
        if s is None:
            s = self._http.s = requests.Session()
        return s

    def send(self, to: str, text: str, category: str = "UTILITY", instance: str | None = None,
             key: str | None = None, timeout: float = 15.0, tries: int = 3, base: str | None = None) -> Sent:
        """POST a send as a careful client does: with an Idempotency-Key, retried with the same key
        when no answer came back (a timeout under load, web killed mid-request). `base`: another web
        pool's URL (R10's second one) instead of the stack's."""
        body: dict[str, Any] = {"to": to, "category": category, "text": text}
        if instance:
            body["instance"] = instance
        headers = {"Authorization": f"Bearer {key or self.world.a.live_key}", "Idempotency-Key": uuid.uuid4().hex}
        for attempt in range(1, tries + 1):
            try:
                r = self.session().post(f"{base or self.stack.web_url}/v1/messages/send", json=body, timeout=timeout,
                                        headers=headers)
            except requests.RequestException as exc:
                if attempt == tries:
                    return Sent(0, {"exception": type(exc).__name__}, to, text, time.monotonic(), attempt)
                time.sleep(1.0)
                continue
            try:
                payload = r.json()
            except ValueError:
                payload = {"raw": r.text[:200]}
            return Sent(r.status_code, payload, to, text, time.monotonic(), attempt)
        raise AssertionError("unreachable")

    def send_many(self, n: int, tag: str, instances: list[Any] | None = None, category: str = "UTILITY") -> list[Sent]:
        """n sends spread over recipients and instances, posted by `sizes.senders` threads."""
        pool = instances if instances is not None else self.world.a.fleet
        recipients = self.world.a.recipients

        def one(i: int) -> Sent:
            return self.send(recipients[i % len(recipients)], f"{tag} #{i}", category,
                             instance=pool[i % len(pool)].name if pool else None)

        with ThreadPoolExecutor(self.sizes.senders) as ex:
            return list(ex.map(one, range(n)))

    def steady_load(self, rate: float, stop: threading.Event, tag: str, out: list[Sent],
                    pool: list[Any] | None = None) -> threading.Thread:
        """A thread sending `rate` messages per second until `stop` is set (results appended to out)."""

        def run() -> None:
            i, start = 0, time.monotonic()
            with ThreadPoolExecutor(self.sizes.senders) as ex:
                futures = []
                while not stop.is_set():
                    due = start + i / rate
                    if (wait := due - time.monotonic()) > 0:
                        stop.wait(wait)
                        continue
                    names = pool or self.world.a.fleet
                    futures.append(ex.submit(self.send, self.world.a.recipients[i % len(self.world.a.recipients)],
                                             f"{tag} #{i}", "UTILITY", names[i % len(names)].name))
                    i += 1
                out.extend(f.result() for f in futures)

        thread = threading.Thread(target=run, name=f"load-{tag}", daemon=True)
        thread.start()
        return thread

    # ---- maintenance and drains -----------------------------------------------------------

    @contextlib.contextmanager
    def maintenance(self) -> Iterator[None]:
        """Run the reconcilers, status sync, ingestion reconciler and instance poll in a loop."""
        stop = threading.Event()

        def loop() -> None:
            from django.db import connection

            from ingestion import reconciler as ingestion_reconciler
            from messaging import reconciler, status_sync
            from messaging.sending import instance_state

            while not stop.wait(MAINTENANCE_EVERY_S):
                for step in (reconciler.run_batch, status_sync.run_batch, instance_state.poll_waiting,
                             lambda: ingestion_reconciler.run_batch(stale_after=timedelta(seconds=15))):
                    try:
                        step()
                    except Exception:
                        self.maintenance_errors += 1
                        with contextlib.suppress(Exception):
                            connection.close()
                self.maintenance_passes += 1
            connection.close()

        thread = threading.Thread(target=loop, name="chaos-maintenance", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(60)

    def final_state(self, ids: list[str]) -> dict[str, Any]:
        """Which accepted messages are final: DELIVERED/READ, or FAILED with a dead letter."""
        from messaging.models import Message

        rows = list(Message.objects.filter(pk__in=ids).values_list("pk", "status", "failure_reason", "dead_letter__id"))
        by_status: dict[str, int] = {}
        lost = []
        for pk, status, _reason, dead in rows:
            by_status[status] = by_status.get(status, 0) + 1
            if not (status in FINAL_OK or (status == "FAILED" and dead is not None)):
                lost.append(str(pk))
        missing = len(set(ids) - {str(r[0]) for r in rows})
        return {"accepted": len(ids), "by_status": by_status, "lost": len(lost) + missing,
                "lost_ids": lost[:10], "missing_rows": missing}

    def drain(self, ids: list[str], timeout: float | None = None) -> dict[str, Any]:
        """Wait (maintenance running) until every id is final or the drain time is over."""
        timeout = timeout if timeout is not None else self.sizes.drain_s
        start = time.monotonic()
        with self.maintenance():
            while True:
                state = self.final_state(ids)
                if state["lost"] == 0 or time.monotonic() - start > timeout:
                    break
                time.sleep(1.0)
        state["drain_s"] = round(time.monotonic() - start, 1)
        return state

    # ---- the gateway side -----------------------------------------------------------------

    def sends_by_text(self, **filters: str) -> dict[str, list[dict[str, Any]]]:
        """sendText calls received by the simulator, grouped by text (each message's text is unique)."""
        grouped: dict[str, list[dict[str, Any]]] = {}
        for s in self.sim.sends(**filters):
            grouped.setdefault(s["text"], []).append(s)
        return grouped


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.25) -> tuple[bool, Any]:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last or time.monotonic() >= deadline:
            return bool(last), last
        time.sleep(interval)
