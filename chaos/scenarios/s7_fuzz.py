"""S7: a property-based fuzz (hypothesis) over what S1's OpenAPI fuzz does not reach, plus the client
API again with hostile bytes, over real HTTP on both pools:

- Evolution's webhook, both forms (`/api/internal/webhook`, `/api/internal/webhook/<event>`),
  authenticated with the instance's real credentials (x-webhook-token, body apikey, jwt_key JWT) and
  unauthenticated (none, junk, another instance's), bodies made from the shapes of tests/simulator/samples with
  mutated types, deep nesting, huge numbers, lone surrogates, NUL, truncated UTF-8, non-ASCII headers;
- the internal forward (`already_saved` with the internal secret);
- the client API: send, opt-in (and opt-out), list and get;
- the dashboard, logged in as a member (CSRF token sent): the dead-letter filters, bulk resend ids,
  resend/dismiss, job progress; and the login form.

The property: no answer is a server error (status ≥ 500, or no answer at all). Each failure is named
by its traceback in the pool's log; hypothesis shrinks every distinct one, and the smallest input
seen for each is printed in the report.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import jwt
import requests
from django.conf import settings
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hsettings
from hypothesis.errors import HypothesisWarning
from hypothesis import strategies as st
from hypothesis.reporting import with_reporter

from .. import fuzz
from ..context import Context
from ..fuzz import Req, hostile_header, hostile_text, json_body, query, segment
from ..stack import start_webhook_pool
from .common import dashboard_session

FAULT = "hypothesis {version}: {examples} examples per target ({targets} targets, ≤ {budget:g} s): webhook " \
        "(both forms, with and without auth), internal forward, client API, dashboard forms and login"
MUST = "0 server errors (status ≥ 500 or no answer)"
WEBHOOK_PATHS = ["/api/internal/webhook", "/api/internal/webhook/messages-update",
                 "/api/internal/webhook/connection-update", "/api/internal/webhook/send-message",
                 "/api/internal/webhook/messages-upsert"]
webhook_paths = st.one_of(st.sampled_from(WEBHOOK_PATHS),
                          st.from_regex(r"[a-z0-9-]{1,40}", fullmatch=True).map(lambda s: f"/api/internal/webhook/{s}"))
pools = st.sampled_from(["web", "webhook"])
JSON = {"Content-Type": "application/json"}
FORM = "application/x-www-form-urlencoded"
MAX_ROUNDS = 8  # hypothesis runs per target (see _fuzz)


class ServerError(AssertionError):
    """A 5xx or no answer. One subclass per signature, so that hypothesis shrinks each distinct failure."""


@dataclass
class Failure:
    target: str
    status: int
    summary: str
    smallest: Req
    seen: int = 1


@dataclass
class Recorder:
    bases: dict[str, str]
    tail: fuzz.LogTail
    sent: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    unsendable: int = 0
    failures: dict[tuple[str, int, str], Failure] = field(default_factory=dict)
    kinds: dict[tuple[str, int, str], type[ServerError]] = field(default_factory=dict)
    settled: set[tuple[str, int, str]] = field(default_factory=set)  # shrunk in an earlier round

    def check(self, target: str, http: requests.Session, req: Req) -> None:
        self.tail.read()  # what came before this request is not its traceback
        try:
            r = http.request(req.method, self.bases[req.base] + req.path, data=req.body, headers=req.headers,
                             timeout=35, allow_redirects=False)
            status, code = r.status_code, _error_code(r)
        except ValueError:  # InvalidHeader, InvalidURL, UnicodeError: the client would not send it
            self.unsendable += 1
            return
        except requests.RequestException as exc:
            status, code = 0, type(exc).__name__
        self.sent[target] += 1
        self.statuses[str(status)] += 1
        if 0 < status < 500:
            return
        summary = self._server_side(code)
        key = (target, status, fuzz.signature(summary))
        known = self.failures.get(key)
        if known is None:
            self.failures[key] = Failure(target, status, summary, req)
        else:
            known.seen += 1
            if req.size() < known.smallest.size():
                known.smallest, known.summary = req, summary
        if key in self.settled:
            return  # counted; hypothesis looks for something new instead of finding this again
        kind = self.kinds.setdefault(key, type(f"ServerError{len(self.kinds)}", (ServerError,), {}))
        raise kind(f"{req.method} {req.path[:80]} → {status or 'no answer'}: {summary}")

    def _server_side(self, code: str) -> str:
        """The traceback the pool logged for this request (waits up to 1 s for it), else its log line."""
        deadline = time.monotonic() + 1.0
        text = ""
        while True:
            text += self.tail.read()
            found = fuzz.summarize(text)
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if found:
            return found[-1]
        logged = [ln.split(" ", 3)[-1] for ln in text.splitlines() if " ERROR " in ln or " WARNING " in ln]
        return (logged[0][:200] if logged else "no traceback logged") + f" [{code}]"


def _error_code(r: requests.Response) -> str:
    try:
        return str(r.json()["error"]["code"])
    except Exception:
        return r.headers.get("Content-Type", "")[:40]


# ---- the targets ------------------------------------------------------------------------------

@dataclass
class Target:
    name: str
    strategy: Any
    session: str  # "plain", "member" (logged-in dashboard) or "anonymous" (login page's CSRF cookie)
    explicit: list[Req]
    share: float = 1.0  # of s7_examples


def _targets(ctx: Context, objects: dict[str, Any], csrf: dict[str, str]) -> list[Target]:
    a, c = ctx.world.a, ctx.world.c
    name = a.instance.name
    token, evolution_token = a.instance.webhook_token, f"TOKEN-{name}".upper()
    now = int(time.time())
    good_jwt = jwt.encode({"iat": now, "exp": now + 6 * 3600, "app": "evolution", "action": "webhook"}, token,
                          algorithm="HS256")
    secret = settings.INTERNAL_WEBHOOK_SECRET
    shapes = [{**s, "instance": name} for s in fuzz.samples()]
    extra_headers = st.dictionaries(st.sampled_from(["Authorization", "x-internal-webhook-secret", "Content-Type",
                                                     "Idempotency-Key", "Accept"]), hostile_header, max_size=2)

    @st.composite
    def webhook_authenticated(draw: Any) -> Req:
        how = draw(st.sampled_from(["x-webhook-token", "apikey", "jwt"]))
        shape = draw(st.sampled_from(shapes))
        shape = {**shape, "apikey": evolution_token} if how == "apikey" else {k: v for k, v in shape.items() if k != "apikey"}
        keep = ("instance", "apikey") if how == "apikey" else ("instance",)
        body = draw(json_body(shape, keep=keep))
        headers: dict[str, Any] = {**JSON, **draw(extra_headers)}
        if how == "x-webhook-token":
            headers["x-webhook-token"] = token
        elif how == "jwt":
            headers["Authorization"] = f"Bearer {good_jwt}"
        elif draw(st.booleans()):
            headers["x-webhook-token"] = draw(hostile_header)
        return Req("POST", draw(webhook_paths), headers, body, draw(pools))

    @st.composite
    def webhook_unauthenticated(draw: Any) -> Req:
        shape = draw(st.sampled_from(shapes))
        how = draw(st.sampled_from(["none", "junk token", "junk apikey", "junk bearer", "another instance",
                                    "junk instance"]))
        if how == "junk instance":
            shape = {**shape, "instance": draw(hostile_text)}
        elif how == "junk apikey":
            shape = {**shape, "apikey": draw(hostile_text)}
        body = draw(json_body(shape, keep=("instance", "apikey")))
        headers: dict[str, Any] = {**JSON, **draw(extra_headers)}
        if how == "junk token":
            headers["x-webhook-token"] = draw(hostile_header)
        elif how == "junk bearer":
            headers["Authorization"] = b"Bearer " + draw(hostile_header)
        elif how == "another instance":
            headers["x-webhook-token"] = c.instance.webhook_token
        return Req("POST", draw(webhook_paths), headers, body, draw(pools))

    @st.composite
    def internal_forward(draw: Any) -> Req:
        shape = {**draw(st.sampled_from(shapes)), "already_saved": True}
        body = draw(json_body(shape, keep=("already_saved",) if draw(st.booleans()) else ()))
        headers: dict[str, Any] = {**JSON, "x-internal-webhook-secret": secret}
        if draw(st.integers(0, 7)) == 0:
            headers["x-internal-webhook-secret"] = draw(hostile_header)
        return Req("POST", draw(st.sampled_from(WEBHOOK_PATHS[:2])), headers, body, draw(pools))

    send_shape = {"to": a.recipients[0], "category": "UTILITY", "text": "fuzz {{code}}", "variables": {"code": "1"},
                  "instance": name, "deliverUntil": "2030-01-01T00:00:00Z", "priority": "NORMAL",
                  "metadata": {"order": "1"}}
    api_headers = {**JSON, "Authorization": f"Bearer {a.live_key}"}

    @st.composite
    def api_headers_drawn(draw: Any) -> dict[str, Any]:
        headers: dict[str, Any] = {**api_headers}
        if draw(st.integers(0, 5)) == 0:
            headers["Authorization"] = b"Bearer " + draw(hostile_header)
        if draw(st.booleans()):
            headers["Idempotency-Key"] = draw(hostile_header)
        return headers

    @st.composite
    def client_send(draw: Any) -> Req:
        return Req("POST", "/v1/messages/send", draw(api_headers_drawn()), draw(json_body(send_shape)))

    @st.composite
    def client_opt_in(draw: Any) -> Req:
        if draw(st.integers(0, 3)) == 0:
            return Req("DELETE", f"/v1/opt-ins/{segment(draw(hostile_text))}", draw(api_headers_drawn()))
        return Req("POST", "/v1/opt-ins", draw(api_headers_drawn()),
                   draw(json_body({"phone": a.recipients[1], "source": "fuzz"})))

    list_keys = st.one_of(st.sampled_from(["status", "category", "to", "createdAfter", "createdBefore", "cursor",
                                           "limit", "page", "reason"]), hostile_text)
    pairs = st.lists(st.tuples(list_keys, hostile_text), max_size=4)

    @st.composite
    def client_read(draw: Any) -> Req:
        where = draw(st.sampled_from(["list", "get", "dead-letters", "instances"]))
        if where == "get":
            ident = draw(st.one_of(st.uuids().map(str), hostile_text, st.just(objects["message_id"])))
            return Req("GET", f"/v1/messages/{segment(ident)}", draw(api_headers_drawn()))
        path = {"list": "/v1/messages", "dead-letters": "/v1/dead-letters", "instances": "/v1/instances"}[where]
        return Req("GET", f"{path}?{query(draw(pairs))}", draw(api_headers_drawn()))

    pid = objects["project_id"]
    ids = st.one_of(st.just(str(objects["dead_letter_id"])), st.integers(0, 10**30).map(str))
    filter_keys = st.one_of(st.sampled_from(["status", "reason", "category", "to", "date_from", "date_to", "page"]),
                            hostile_text)
    form_headers = {"Content-Type": FORM}

    def form(fields: list[tuple[str, str]], token: str) -> bytes:
        return query([("csrfmiddlewaretoken", token), *fields]).encode()

    @st.composite
    def dashboard(draw: Any) -> Req:
        project = draw(st.one_of(st.just(pid), st.integers(0, 10**30).map(str)))
        base = f"/dashboard/p/{project}"
        what = draw(st.sampled_from(["filters", "bulk ids", "bulk all", "resend", "dismiss", "progress", "status"]))
        referer = {"Referer": ctx.stack.web_url + base + "/dead-letters/"}
        if what == "filters":
            return Req("GET", f"{base}/dead-letters/?{query(draw(st.lists(st.tuples(filter_keys, hostile_text), max_size=5)))}")
        if what in ("bulk ids", "bulk all"):
            fields = [("ids", v) for v in draw(st.lists(st.one_of(hostile_text, ids), max_size=5))]
            if what == "bulk all":
                fields = [("scope", draw(st.one_of(st.just("all"), hostile_text)))] + \
                    draw(st.lists(st.tuples(filter_keys, hostile_text), max_size=5))
            fields.append(("query", draw(hostile_text)))
            return Req("POST", f"{base}/dead-letters/bulk-resend", {**form_headers, **referer},
                       form(fields, csrf["member"]))
        if what in ("resend", "dismiss"):
            return Req("POST", f"{base}/dead-letters/{draw(ids)}/{what}", {**form_headers, **referer},
                       form([], csrf["member"]))
        if what == "progress":
            return Req("GET", f"{base}/bulk/{draw(st.integers(0, 10**30))}/progress.json")
        return Req("GET", f"{base}/messages/{draw(st.uuids())}/status.json")

    @st.composite
    def login(draw: Any) -> Req:
        fields = [("username", draw(hostile_text)), ("password", draw(hostile_text))]
        if draw(st.booleans()):
            fields.append(("next", draw(hostile_text)))
        url = "/dashboard/login/"
        return Req("POST", url, {"Content-Type": FORM, "Referer": ctx.stack.web_url + url},
                   form(fields, csrf["anonymous"]))

    # The input classes issue 21 names, tried on every run whatever the generator draws.
    deep = fuzz.Raw("[" * 5000 + "]" * 5000)
    event = {"event": "messages.update", "instance": name,
             "data": {"keyId": "3EB0C431C26A1916E07A4B", "status": "READ"}}
    explicit_hooks = [
        Req("POST", WEBHOOK_PATHS[0], {**JSON, "x-webhook-token": token}, fuzz.encode(fuzz.dumps({**event, "data": deep}))),
        Req("POST", WEBHOOK_PATHS[0], {**JSON, "x-webhook-token": "tökén".encode("latin-1")}, fuzz.encode(fuzz.dumps(event))),
        Req("POST", WEBHOOK_PATHS[1], JSON, fuzz.encode(fuzz.dumps({**event, "apikey": "\ud800"})), "webhook"),
    ]
    return [
        Target("webhook, authenticated", webhook_authenticated(), "plain", explicit_hooks[:1]),
        Target("webhook, unauthenticated", webhook_unauthenticated(), "plain", explicit_hooks[1:]),
        Target("internal forward", internal_forward(), "plain", [
            Req("POST", WEBHOOK_PATHS[0], {**JSON, "x-internal-webhook-secret": secret},
                fuzz.encode(fuzz.dumps({**event, "already_saved": True, "data": {"keyId": fuzz.Raw("9" * 5000)}})))]),
        Target("client API: send", client_send(), "plain", [
            Req("POST", "/v1/messages/send", api_headers, fuzz.encode(fuzz.dumps({**send_shape, "metadata": deep}))),
            Req("POST", "/v1/messages/send", {**api_headers, "Idempotency-Key": "clé".encode("latin-1")},
                fuzz.encode(fuzz.dumps(send_shape))),
            # DRF's error echoes the refused choice back: the answer itself must be encodable.
            Req("POST", "/v1/messages/send", api_headers, fuzz.encode(fuzz.dumps({**send_shape, "category": "\ud800"})))]),
        Target("client API: opt-in", client_opt_in(), "plain", []),
        Target("client API: list and get", client_read(), "plain", []),
        Target("dashboard: filters, bulk resend, actions", dashboard(), "member", [
            Req("POST", f"/dashboard/p/{pid}/dead-letters/bulk-resend",
                {**form_headers, "Referer": f"{ctx.stack.web_url}/dashboard/p/{pid}/dead-letters/"},
                form([("ids", "²")], csrf["member"]))]),
        Target("dashboard: login form", login(), "anonymous", [], share=0.25),
    ]


# ---- the run ----------------------------------------------------------------------------------

def _objects(ctx: Context) -> dict[str, Any]:
    """A failed message with its dead letter in project A, for the dashboard's ids."""
    from messaging.models import DeadLetter, Message

    a = ctx.world.a
    message = Message.objects.create(
        project=a.project, environment="LIVE", category="UTILITY", to=a.recipients[0], template="s7", text="s7",
        instance=a.instance, deliver_until=timezone.now() + timedelta(hours=1), status="FAILED",
        failure_reason="INVALID_RECIPIENT")
    dead = DeadLetter.objects.create(message=message, project=a.project, reason="INVALID_RECIPIENT")
    return {"message_id": str(message.pk), "dead_letter_id": dead.pk, "project_id": str(a.project.pk)}


def _sessions(ctx: Context) -> dict[str, requests.Session]:
    member = dashboard_session(ctx, ctx.world.a.project)
    anonymous = requests.Session()
    anonymous.get(f"{ctx.stack.web_url}/dashboard/login/", timeout=15)
    return {"plain": requests.Session(), "member": member, "anonymous": anonymous}


def _fuzz(target: Target, http: requests.Session, recorder: Recorder, examples: int, until: float,
          seed_value: int) -> list[str]:
    """Run one target under hypothesis, in rounds; returns what hypothesis reported (its falsifying
    examples). Hypothesis stops generating at its first failure and shrinks it; the next round (next
    seed) counts the failures already shrunk without raising them, so it explores further, until the
    target's examples or its share of the time are spent, or a round finds nothing new."""
    report: list[str] = []

    def check(req: Req) -> None:
        # Past the target's time, or twice its examples (shrinking sends too): not sent any more.
        if time.monotonic() > until or recorder.sent[target.name] >= 2 * examples:
            return
        recorder.check(target.name, http, req)

    # The explicit inputs go first and outside hypothesis: a failing @example would stop it
    # before it generates anything.
    for req in target.explicit:
        try:
            recorder.check(target.name, http, req)
        except ServerError as exc:
            report.append(f"explicit input failed: {exc}")
    recorder.settled |= set(recorder.failures)
    for round_ in range(MAX_ROUNDS):
        left = examples - recorder.sent[target.name]
        if left <= 0 or time.monotonic() > until:
            break
        test = given(target.strategy)(check)
        test = hsettings(max_examples=left, deadline=None, database=None, derandomize=False,
                         suppress_health_check=list(HealthCheck), report_multiple_bugs=True, print_blob=False,
                         phases=[Phase.generate, Phase.shrink])(test)
        test = seed(seed_value + round_)(test)
        known = len(recorder.failures)
        with with_reporter(report.append), warnings.catch_warnings():
            warnings.simplefilter("ignore", HypothesisWarning)  # "overly large repr": Req shortens its own
            try:
                test()
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # ServerError(s), or hypothesis' Flaky*
                report += [f"round {round_ + 1}:"] + _notes(exc)
        recorder.settled |= set(recorder.failures)
        if len(recorder.failures) == known:
            break  # a whole round without anything new
    return report


def _notes(exc: BaseException) -> list[str]:
    lines = [f"{type(exc).__name__}: {str(exc)[:300]}", *getattr(exc, "__notes__", [])]
    for sub in getattr(exc, "exceptions", ()):
        lines += _notes(sub)
    return lines


def run(ctx: Context) -> dict[str, Any]:
    from importlib.metadata import version

    ctx.fresh()
    sizes = ctx.sizes
    objects = _objects(ctx)
    sessions = _sessions(ctx)
    csrf = {"member": sessions["member"].cookies.get("csrftoken", ""),
            "anonymous": sessions["anonymous"].cookies.get("csrftoken", "")}
    hook, hook_url = start_webhook_pool(ctx.stack, workers=sizes.s6_webhook_workers)
    targets = _targets(ctx, objects, csrf)
    recorder = Recorder({"web": ctx.stack.web_url, "webhook": hook_url},
                        fuzz.LogTail([ctx.stack.processes["web"].log, hook.log]))  # type: ignore[attr-defined]
    reports: dict[str, list[str]] = {}
    started = time.monotonic()
    try:
        for i, target in enumerate(targets):
            # What a target leaves of its share of the budget goes to the ones after it.
            left = sizes.s7_budget_s - (time.monotonic() - started)
            until = time.monotonic() + max(0.0, left) / (len(targets) - i)
            examples = max(1, int(sizes.s7_examples * target.share))
            ctx.log(f"chaos: S7 {target.name}: up to {examples} examples, {max(0.0, left) / (len(targets) - i):.0f} s")
            reports[target.name] = _fuzz(target, sessions[target.session], recorder, examples, until, sizes.s7_seed)
    finally:
        hook.stop()  # type: ignore[attr-defined]
    failures = sorted(recorder.failures.values(), key=lambda f: (f.target, f.status, f.summary))
    server_errors = sum(n for status, n in recorder.statuses.items() if status == "0" or int(status) >= 500)
    figures = {
        "examples": sum(recorder.sent.values()), "targets": dict(recorder.sent), "server_errors": server_errors,
        "distinct_failures": len(failures), "statuses": dict(sorted(recorder.statuses.items())),
        "not_sendable_by_the_client": recorder.unsendable, "elapsed_s": round(time.monotonic() - started, 1),
        "failures": [f"{f.target}: {f.status or 'no answer'} {f.summary} (×{f.seen})" for f in failures],
    }
    notes = [f"smallest failing input seen — {f.target}, {f.status or 'no answer'}, {f.summary}:\n{f.smallest!r}"
             for f in failures]
    for name, lines in reports.items():
        if lines:
            notes.append(f"hypothesis on {name}:\n" + "\n".join(line[:1500] for line in lines[:40]))
    return {"passed": server_errors == 0 and bool(recorder.sent),
            "fault": FAULT.format(version=version("hypothesis"), examples=sizes.s7_examples, targets=len(targets),
                                  budget=sizes.s7_budget_s),
            "must": MUST, "figures": figures, "notes": notes}
