"""S8: one tenant cannot stall another through its callbacks or through host lookups (issue 45 §2, §3).

1. Tarpit. Project A's TEST endpoint points at a receiver that answers one byte a second (tests/support/tarpit.py),
   project C's at a prompt one (tests/support/receiver.py). The Procfile's worker_callbacks (8 threads, the product's
   defaults: CALLBACKS_ATTEMPT_SECONDS 15, CALLBACKS_INFLIGHT_PER_PROJECT 4) and worker_callbacks_relay run next
   to the stack, with the relay pass published every CALLBACKS_RELAY_SECONDS as beat's entry does. A's circuit is
   kept from opening (CALLBACKS_CIRCUIT_FAILURES=1000), so that only the caps keep C's share of the threads. C's
   callbacks come from TEST sends to the READ magic number (four status callbacks each); their latency is the
   arrival at C's receiver less the delivery row's creation. Measured alone, then while A's callbacks fill the
   tarpit. Pass: C's p99 within 2x of alone, at most the project cap of A's attempts in flight at once, and every
   attempt of A's a failure ended at CALLBACKS_ATTEMPT_SECONDS.
2. A name server that never answers. A second web pool (the stack's web command) runs in a mount namespace of its
   own (`unshare -m`) whose /etc/resolv.conf names a name server on loopback that takes every question and never
   answers; the SSRF guard is on there (CALLBACKS_ALLOW_PRIVATE_ADDRESSES=false). Threads of tenant A register
   endpoints and send with callbackUrls at names that pool must look up, while C reads its messages from the same
   pool. Pass: no 5xx; every lookup answered 422 within CALLBACKS_RESOLVE_SECONDS + 1.5 s; every read of C's
   answered 200, its p99 within CALLBACKS_RESOLVE_SECONDS + 1 s (no read waits behind more than one bounded lookup).
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from typing import Any

import requests

from ..context import Context, wait_for

FAULT = ("tenant A's callback receiver drips one byte a second (a tarpit); a name server that never answers "
         "while A registers endpoints and sends with callbackUrls")
MUST = ("C's callbacks p99 within 2x of no tarpit; A's attempts cut at the deadline, at most its cap in flight; "
        "the client API answers on while lookups hang")
READ_NUMBER = "+12015550101"  # messaging.test_numbers: SENT, SERVER_ACK, DELIVERED, READ without Evolution
NAME_SERVER = "127.53.53.53"  # on loopback (all of 127/8 is), where nothing else answers port 53
WORKERS = ("worker_callbacks", "worker_callbacks_relay")


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def start_worker(ctx: Context, name: str, env: dict[str, str]) -> Any:
    """A Procfile callbacks worker next to the chaos stack, with the Procfile's 8 delivery threads."""
    from pilot_status import topology
    from tests.support.processes import Process, log_size, wait_for_log

    described = topology.process(name)
    argv = described.command(replace(ctx.stack.site(), callbacks_threads="8"))
    process = Process(f"s8-{described.service}", argv, {**ctx.stack.env, **env})
    offset = log_size(process.log)
    process.start()
    wait_for_log(process.log, "ready.", proc=process.proc, start_at=offset, timeout=60)
    return process


def stop_quietly(processes: list[Any]) -> None:
    """Stop them together; on a loaded host one may take a while to die even of SIGKILL (it waits for a CPU):
    wait for it rather than fail the row on it."""
    from tests.support.processes import stop_all

    try:
        stop_all(processes, 15)
    except subprocess.TimeoutExpired:
        for process in processes:
            if process.proc is not None:
                process.proc.wait(120)


def create_endpoint(ctx: Context, key: str, url: str) -> str:
    r = requests.post(f"{ctx.stack.web_url}/v1/webhook-endpoints", json={"url": url, "eventTypes": ["message.status"]},
                      headers={"Authorization": f"Bearer {key}"}, timeout=15)
    if r.status_code != 201:
        raise RuntimeError(f"endpoint refused: {r.status_code} {r.text[:300]}")
    return str(r.json()["id"])


def send_reads(ctx: Context, key: str, n: int, pace_s: float = 0.2) -> list[str]:
    ids = []
    for i in range(n):
        sent = ctx.send(READ_NUMBER, f"s8 {i} {time.monotonic()}", key=key)
        if sent.id:
            ids.append(sent.id)
        time.sleep(pace_s)
    return ids


def callbacks_of(endpoint_id: str, since: float) -> tuple[int, int]:
    """(deliveries written for the endpoint since `since`, how many of them succeeded)."""
    from datetime import datetime, timezone

    from callbacks.models import Delivery

    rows = Delivery.objects.filter(endpoint_id=endpoint_id, created_at__gte=datetime.fromtimestamp(since, timezone.utc))
    return rows.count(), rows.filter(status="SUCCEEDED").count()


def latencies(receiver: Any, since: float) -> list[float]:
    """Seconds from each delivery row's creation to its arrival at `receiver`, for arrivals after `since`."""
    from callbacks.models import Delivery

    arrived = {r.headers.get("webhook-id"): r.at for r in receiver.received if r.at >= since and r.answered == 204}
    created = dict(Delivery.objects.filter(webhook_id__in=list(arrived)).values_list("webhook_id", "created_at"))
    return [arrived[w] - created[w].timestamp() for w in arrived if w in created]


def c_round(ctx: Context, receiver: Any, endpoint_id: str, n: int) -> dict[str, Any]:
    started = time.time()
    send_reads(ctx, ctx.world.c.test_key, n)
    expected = 4 * n
    wait_for(lambda: callbacks_of(endpoint_id, started)[1] >= expected, timeout=ctx.sizes.drain_s)
    owed, done = callbacks_of(endpoint_id, started)
    seconds = latencies(receiver, started)
    return {"owed": owed, "delivered": done, "p50_s": round(sorted(seconds)[len(seconds) // 2], 3) if seconds else None,
            "p99_s": round(p99(seconds), 3), "max_s": round(max(seconds), 3) if seconds else None}


def tarpit_row(ctx: Context, figures: dict[str, Any], notes: list[str]) -> bool:
    from django.conf import settings

    from bench.callbacks_on import RelayTicker
    from callbacks.models import DeliveryAttempt
    from messaging import opt_ins
    from tests.support.receiver import Receiver
    from tests.support.tarpit import Tarpit

    env = {"CALLBACKS_CIRCUIT_FAILURES": "1000"}
    a, c = ctx.world.a, ctx.world.c
    for tenant in (a, c):
        opt_ins.record(tenant.project, READ_NUMBER, "s8", environment="TEST")
    secret = {"value": ""}
    receiver = Receiver(lambda: secret["value"])
    receiver.set("ok")
    tarpit = Tarpit(interval=1.0)
    workers: list[Any] = []
    ticker = None
    a_endpoint = ""
    try:
        for name in WORKERS:
            workers.append(start_worker(ctx, name, env))
        ticker = RelayTicker(float(settings.CALLBACKS_RELAY_SECONDS)).start()
        r = requests.post(f"{ctx.stack.web_url}/v1/webhook-endpoints",
                          json={"url": receiver.url, "eventTypes": ["message.status"]},
                          headers={"Authorization": f"Bearer {c.test_key}"}, timeout=15)
        r.raise_for_status()
        secret["value"], c_endpoint = r.json()["secret"], r.json()["id"]
        n = ctx.sizes.s8_messages
        c_round(ctx, receiver, c_endpoint, max(2, n // 4))  # warm-up: the workers' first connections and imports
        alone = c_round(ctx, receiver, c_endpoint, n)

        a_endpoint = create_endpoint(ctx, a.test_key, tarpit.url)
        tarpit_started = time.time()
        send_reads(ctx, a.test_key, n, pace_s=0.05)
        filled, _ = wait_for(lambda: tarpit.connections() >= 1, timeout=60)
        beside = c_round(ctx, receiver, c_endpoint, n)
        in_tarpit_now = tarpit.connections()
        # A's first attempts end at their deadline: wait for them, then read how they ended.
        wait_for(lambda: DeliveryAttempt.objects.filter(delivery__endpoint_id=a_endpoint).count() >= 1,
                 timeout=settings.CALLBACKS_ATTEMPT_SECONDS + 30)
        attempts = list(DeliveryAttempt.objects.filter(delivery__endpoint_id=a_endpoint).values_list(
            "succeeded", "duration_ms", "error"))
    finally:
        if a_endpoint:
            requests.patch(f"{ctx.stack.web_url}/v1/webhook-endpoints/{a_endpoint}", json={"enabled": False},
                           headers={"Authorization": f"Bearer {a.test_key}"}, timeout=15)
        if ticker is not None:
            ticker.stop()
        stop_quietly(workers)
        tarpit.stop()
        receiver.stop()
    cap = settings.CALLBACKS_INFLIGHT_PER_PROJECT
    deadline_ms = settings.CALLBACKS_ATTEMPT_SECONDS * 1000
    cut = [d for ok, d, error in attempts if not ok and error.startswith("DeadlineExceeded")]
    ratio = beside["p99_s"] / alone["p99_s"] if alone["p99_s"] else float("nan")
    figures.update({
        "c_alone": alone, "c_beside_tarpit": beside, "c_p99_ratio": round(ratio, 2),
        "a_most_in_flight": tarpit.most_open, "a_cap": cap, "a_in_flight_during_c": in_tarpit_now,
        "a_tarpit_filled": bool(filled), "a_attempts": len(attempts), "a_attempts_cut_at_deadline": len(cut),
        "a_longest_attempt_ms": max((d for _, d, _ in attempts), default=None),
        "a_seconds_in_tarpit": round(time.time() - tarpit_started, 1),
    })
    notes.append(f"the callbacks workers ran with CALLBACKS_CIRCUIT_FAILURES=1000 (a documented setting): A's circuit "
                 f"stays closed, so only the in-flight caps (CALLBACKS_INFLIGHT_PER_PROJECT={cap}) keep C's share of the "
                 "8 delivery threads")
    return bool(
        filled and alone["delivered"] == alone["owed"] > 0 and beside["delivered"] == beside["owed"] > 0
        and ratio <= 2.0 and 0 < tarpit.most_open <= cap and attempts and len(cut) == len(attempts)
        and all(d <= deadline_ms + 1500 for d in cut)
    )


class SilentNameServer:
    """Port 53 (UDP and TCP) on a loopback address: every question is read, none is answered."""

    def __init__(self, address: str = NAME_SERVER):
        self.questions = 0
        self._stop = threading.Event()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((address, 53))
        self.udp.settimeout(0.2)
        self.tcp = socket.create_server((address, 53))
        self.tcp.settimeout(0.2)
        self._held: list[socket.socket] = []
        threading.Thread(target=self._udp, daemon=True).start()
        threading.Thread(target=self._tcp, daemon=True).start()

    def _udp(self) -> None:
        while not self._stop.is_set():
            try:
                self.udp.recvfrom(4096)
                self.questions += 1
            except (TimeoutError, OSError):
                continue

    def _tcp(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
                self._held.append(conn)  # held open, never answered
                self.questions += 1
            except (TimeoutError, OSError):
                continue

    def stop(self) -> None:
        self._stop.set()
        for sock in (self.udp, self.tcp, *self._held):
            sock.close()


def timed(call: Any) -> tuple[int, float]:
    started = time.monotonic()
    try:
        status = call().status_code
    except requests.RequestException:
        status = 0
    return status, time.monotonic() - started


def name_server_row(ctx: Context, figures: dict[str, Any], notes: list[str]) -> bool:
    from django.conf import settings

    from tests.support.processes import Process, free_port, wait_for_port

    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        notes.append("not run: this host does not let the harness make a mount namespace (`unshare -m`), which the "
                     "silent name server needs without touching the host's /etc/resolv.conf")
        figures["name_server"] = "not run"
        return False
    a, c = ctx.world.a, ctx.world.c
    server = SilentNameServer()
    resolv = tempfile.NamedTemporaryFile("w", suffix=".resolv.conf", delete=False)
    resolv.write(f"nameserver {NAME_SERVER}\n")
    resolv.close()
    port = free_port()
    argv = list(ctx.stack.processes["web"].argv)
    argv[argv.index("-b") + 1] = f"127.0.0.1:{port}"
    wrapped = ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"', resolv.name, *argv]
    pool = Process("s8-web-silent-dns", wrapped, {**ctx.stack.env, "PORT": str(port),
                                                  "CALLBACKS_ALLOW_PRIVATE_ADDRESSES": "false"})
    base = f"http://127.0.0.1:{port}"
    reads: list[tuple[int, float]] = []
    lookups: list[tuple[int, float]] = []
    stop = threading.Event()

    def read_loop(out: list[tuple[int, float]], until: threading.Event | None, count: int = 0) -> None:
        http = requests.Session()
        done = 0
        while (until is not None and not until.is_set()) or (until is None and done < count):
            out.append(timed(lambda: http.get(f"{base}/v1/messages?limit=5", timeout=30,
                                              headers={"Authorization": f"Bearer {c.live_key}"})))
            done += 1
            time.sleep(0.1)

    def lookup_loop(i: int) -> None:
        http = requests.Session()
        n = 0
        while not stop.is_set():
            n += 1
            name = f"https://t{i}-{n}.pilot-s8.test/hook"
            if n % 2:
                call = lambda: http.post(f"{base}/v1/webhook-endpoints", timeout=30,  # noqa: E731
                                         json={"url": name, "eventTypes": ["message.status"]},
                                         headers={"Authorization": f"Bearer {a.live_key}"})
            else:
                call = lambda: http.post(f"{base}/v1/messages/send", timeout=30,  # noqa: E731
                                         json={"to": a.recipients[0], "category": "UTILITY", "text": "s8",
                                               "callbackUrl": name},
                                         headers={"Authorization": f"Bearer {a.live_key}"})
            lookups.append(timed(call))

    try:
        pool.start()
        wait_for_port(port, proc=pool.proc)
        read_loop([], None, count=10)  # warm-up: each worker's first requests load code and connect
        baseline: list[tuple[int, float]] = []
        read_loop(baseline, None, count=40)
        readers = [threading.Thread(target=read_loop, args=(reads, stop))]
        attackers = [threading.Thread(target=lookup_loop, args=(i,)) for i in range(ctx.sizes.s8_attackers)]
        for thread in (*readers, *attackers):
            thread.start()
        time.sleep(ctx.sizes.s8_dns_seconds)
        stop.set()
        for thread in (*readers, *attackers):
            thread.join(60)
    finally:
        stop_quietly([pool])
        server.stop()
    bound = settings.CALLBACKS_RESOLVE_SECONDS
    lookup_statuses: dict[str, int] = {}
    for status, _ in lookups:
        lookup_statuses[str(status)] = lookup_statuses.get(str(status), 0) + 1
    read_statuses: dict[str, int] = {}
    for status, _ in reads:
        read_statuses[str(status)] = read_statuses.get(str(status), 0) + 1
    figures.update({
        "dns_questions_unanswered": server.questions,
        "lookup_requests": len(lookups), "lookup_answers": lookup_statuses,
        "lookup_longest_s": round(max((s for _, s in lookups), default=0), 2),
        "reads_alone_p99_s": round(p99([s for _, s in baseline]), 3),
        "reads_during": len(reads), "read_answers": read_statuses,
        "reads_during_p99_s": round(p99([s for _, s in reads]), 3),
        "reads_during_max_s": round(max((s for _, s in reads), default=0), 2),
    })
    notes.append(f"the silent name server's pool: the stack's web command ({ctx.stack.env.get('WEB_CONCURRENCY', '2')} "
                 f"sync workers) in its own mount namespace, CALLBACKS_RESOLVE_SECONDS={bound:g}, "
                 f"{ctx.sizes.s8_attackers} threads looking up for {ctx.sizes.s8_dns_seconds:g} s")
    return bool(
        server.questions > 0 and lookups and set(lookup_statuses) <= {"422", "429"}
        and all(s <= bound + 1.5 for _, s in lookups)
        and reads and set(read_statuses) == {"200"} and p99([s for _, s in reads]) <= bound + 1.0
    )


def run(ctx: Context) -> dict[str, Any]:
    ctx.fresh()
    figures: dict[str, Any] = {}
    notes: list[str] = []
    tarpit_ok = tarpit_row(ctx, figures, notes)
    dns_ok = name_server_row(ctx, figures, notes)
    figures["tarpit_part"] = "pass" if tarpit_ok else "FAIL"
    figures["name_server_part"] = "pass" if dns_ok else "FAIL"
    return {"passed": tarpit_ok and dns_ok, "fault": FAULT, "must": MUST, "figures": figures, "notes": notes}
