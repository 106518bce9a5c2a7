"""S6: amplification and memory. Unauthenticated junk against both gunicorn pools (the stack's `web`,
which also serves /api/internal/, and a `webhook` pool started for the row): webhooks naming
random 60 KB instances, random apikeys, junk x-webhook-token headers (both webhook forms), client-API
sends with bad keys and large bodies, dashboard login posts with junk. The resident memory (RSS, from
/proc) of every worker of both pools is read after a warm-up (code loaded, first-use caches filled)
and again after the junk, each request on a new connection so that every worker gets some. No worker
may grow by more than `s6_growth_mb`, none may answer 5xx or drop a connection, and none may be
replaced (a worker killed and restarted would hide its growth)."""

from __future__ import annotations

import json
import random
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from ..context import Context
from ..stack import start_webhook_pool

FAULT = "{n:,} unauthenticated junk requests on both pools: webhooks with 60 KB random instance names, random " \
        "apikeys, junk x-webhook-token headers; client-API sends with bad keys and large bodies; junk dashboard logins"
MUST = "RSS growth ≤ {mb:g} MB for every web and webhook worker; no 5xx; no worker replaced"
NAME_CHARS = 60_000
MB = 1024 * 1024

# (method, pool, path, headers, body bytes or form dict)
Junk = tuple[str, str, str, dict[str, Any], Any]


def workers(master_pid: int) -> list[int]:
    """The gunicorn master's children (its workers), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses.
        if int(stat.rsplit(")", 1)[1].split()[1]) == master_pid:
            found.append(int(entry.name))
    return sorted(found)


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _event(instance: str, **extra: Any) -> bytes:
    return json.dumps({"event": "messages.update", "instance": instance,
                       "data": {"keyId": "3EB0" + secrets.token_hex(9).upper(), "remoteJid": "5511960000000@s.whatsapp.net",
                                "fromMe": True, "status": "READ"},
                       "date_time": "2026-01-01T00:00:00.000Z", **extra}).encode()


def _kinds(ctx: Context) -> dict[str, Callable[[int, random.Random], Junk]]:
    known = ctx.world.a.instance.name
    json_type = {"Content-Type": "application/json"}

    def webhook_path(i: int) -> str:
        return "/api/internal/webhook" if i % 2 == 0 else "/api/internal/webhook/messages-update"

    def pool(i: int) -> str:
        return "webhook" if (i // 2) % 2 == 0 else "web"

    def long_name(i: int, rng: random.Random) -> Junk:
        return ("POST", pool(i), webhook_path(i), json_type, _event(secrets.token_hex(NAME_CHARS // 2)))

    def random_apikey(i: int, rng: random.Random) -> Junk:
        name = known if i % 2 else f"junk-{secrets.token_hex(rng.randint(2, 64))}"
        return ("POST", pool(i), webhook_path(i), json_type,
                _event(name, apikey=secrets.token_urlsafe(rng.randint(8, 3000))))

    def junk_token(i: int, rng: random.Random) -> Junk:
        token: str | bytes = secrets.token_hex(rng.randint(4, 4000))
        if i % 10 == 0:  # non-ASCII: bytes no token holds (latin-1 on the wire)
            token = "tökén-".encode("latin-1") + secrets.token_hex(16).encode()
        headers = {**json_type, "x-webhook-token": token}
        if i % 3 == 0:
            headers["Authorization"] = f"Bearer {secrets.token_urlsafe(rng.randint(16, 2000))}"
        return ("POST", pool(i), webhook_path(i), headers, _event(known if i % 3 else secrets.token_hex(200)))

    def bad_key_send(i: int, rng: random.Random) -> Junk:
        body = json.dumps({"to": "+5511960000000", "category": "UTILITY",
                           "text": secrets.token_hex(rng.randint(10_000, 100_000) // 2),
                           "metadata": {"k": secrets.token_hex(rng.randint(1, 2000))}}).encode()
        key = f"ps_live_{secrets.token_urlsafe(rng.randint(8, 200))}"
        return ("POST", "web", "/v1/messages/send", {**json_type, "Authorization": f"Bearer {key}",
                                                     "Idempotency-Key": secrets.token_hex(32)}, body)

    def junk_login(i: int, rng: random.Random) -> Junk:
        # Mostly refused before any password is hashed (no CSRF token, or a username over 150
        # characters); one in 25 is a well-formed guess, which costs a full password hash.
        form = {"username": secrets.token_urlsafe(rng.randint(151, 8000)), "password": secrets.token_urlsafe(rng.randint(1, 4000))}
        if i % 25 == 0:
            form = {"username": f"guess-{secrets.token_hex(8)}", "password": secrets.token_urlsafe(16)}
        return ("POST", "web", "/dashboard/login/", {"with_csrf": i % 2 == 0 or i % 25 == 0}, form)

    return {"webhook, 60 KB random instance name": long_name, "webhook, random apikey": random_apikey,
            "webhook, junk x-webhook-token": junk_token, "send, bad key, large body": bad_key_send,
            "dashboard login, junk": junk_login}


class Junkyard:
    """Posts junk from a few threads, one session each, and counts the answers by kind. Each body is
    made right before it is sent (5,000 of them at once would cost the harness ~150 MB)."""

    def __init__(self, ctx: Context, hook_url: str):
        self.bases = {"web": ctx.stack.web_url, "webhook": hook_url}
        self.kinds = list(_kinds(ctx).items())
        self.local = threading.local()
        self.lock = threading.Lock()
        self.answers: dict[str, Counter[str]] = {}
        self.seconds: Counter[str] = Counter()
        self.server_errors: list[str] = []

    def session(self) -> tuple[requests.Session, str]:
        s = getattr(self.local, "s", None)
        if s is None:
            s = self.local.s = requests.Session()
            s.get(f"{self.bases['web']}/dashboard/login/", timeout=15)
            self.local.csrf = s.cookies.get("csrftoken", "")
        return s, self.local.csrf

    def post(self, i: int) -> None:
        kind, make = self.kinds[i % len(self.kinds)]
        method, pool, path, headers, body = make(i // len(self.kinds), random.Random(i))
        http, csrf = self.session()
        url = self.bases[pool] + path
        started = time.monotonic()
        try:
            if isinstance(body, dict):  # a form: the login page
                form = {**body, "csrfmiddlewaretoken": csrf} if headers.get("with_csrf") else body
                r = http.request(method, url, data=form, headers={"Referer": url}, timeout=35, allow_redirects=False)
            else:
                # A new connection each time: a kept-alive one stays with the gthread worker that
                # accepted it, and the junk must reach every worker of the pool.
                r = http.request(method, url, data=body, headers={**headers, "Connection": "close"}, timeout=35,
                                 allow_redirects=False)
            status = str(r.status_code)
        except requests.RequestException as exc:
            status = f"no answer ({type(exc).__name__})"
        with self.lock:
            self.seconds[kind] += time.monotonic() - started
            self.answers.setdefault(kind, Counter())[status] += 1
            if not status.isdigit() or int(status) >= 500:
                self.server_errors.append(f"{kind} → {pool} {path}: {status}")

    def run(self, first: int, n: int, threads: int) -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(self.post, range(first, first + n)))


def _snapshot(masters: dict[str, int]) -> dict[str, int]:
    """RSS of every worker, keyed '<pool> <pid>'."""
    out = {}
    for pool, master in masters.items():
        for pid in workers(master):
            rss = rss_bytes(pid)
            if rss is not None:
                out[f"{pool} {pid}"] = rss
    return out


def run(ctx: Context) -> dict[str, Any]:
    ctx.fresh()
    sizes = ctx.sizes
    hook, hook_url = start_webhook_pool(ctx.stack, workers=sizes.s6_webhook_workers)
    try:
        masters = {"web": ctx.stack.processes["web"].proc.pid, "webhook": hook.proc.pid}  # type: ignore[attr-defined]
        yard = Junkyard(ctx, hook_url)
        # Warm-up: every worker imports its code and fills its first-use caches before the first reading.
        warm = sizes.s6_warmup
        yard.run(0, warm, threads=sizes.senders)
        time.sleep(1.0)
        before = _snapshot(masters)
        yard.answers.clear()
        yard.seconds.clear()
        yard.server_errors.clear()
        started = time.monotonic()
        yard.run(warm, sizes.s6_requests, threads=sizes.senders)
        elapsed = time.monotonic() - started
        time.sleep(1.0)
        after = _snapshot(masters)
    finally:
        hook.stop()  # type: ignore[attr-defined]
    growth = {w: round((after[w] - before[w]) / MB, 1) for w in before if w in after}
    replaced = sorted(set(before) ^ set(after))
    over = {w: g for w, g in growth.items() if g > sizes.s6_growth_mb}
    per_worker = {w: f"{before[w] / MB:.1f} → {after[w] / MB:.1f} MB ({growth[w]:+.1f})" for w in growth}
    answers = {kind: dict(c) for kind, c in yard.answers.items()}
    figures = {"requests": sum(sum(c.values()) for c in yard.answers.values()), "requests_per_s": round(sizes.s6_requests / elapsed, 1),
               "server_errors": len(yard.server_errors), "max_growth_mb": max(growth.values(), default=None),
               "mean_ms_by_kind": {k: round(1000 * yard.seconds[k] / max(1, sum(c.values())))
                                   for k, c in yard.answers.items()},
               "workers": per_worker, "over_bound": over, "workers_replaced": replaced, "answers": answers,
               "server_error_examples": dict(Counter(yard.server_errors).most_common(10))}
    both_pools = {w.split()[0] for w in growth} == {"web", "webhook"}
    passed = both_pools and not over and not replaced and not yard.server_errors
    return {"passed": passed, "fault": FAULT.format(n=sizes.s6_requests),
            "must": MUST.format(mb=sizes.s6_growth_mb), "figures": figures, "notes": []}
