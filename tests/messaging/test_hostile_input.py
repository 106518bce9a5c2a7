"""Hostile input on the client API (issue 21): bounded work per request, no 5xx for any malformed input.

Every /v1 endpoint, fed what a careless or hostile client sends: text that renders past WhatsApp's
4,096 characters, JSON nested thousands of levels deep, numbers of thousands of digits, lone
surrogates, NUL, truncated UTF-8, a wrong type in every field, junk in the credentials, the
Idempotency-Key, the query and the path. Each answer is a 4xx in the JSON error envelope and
nothing is stored. The last tests post the same bodies to a real gunicorn process.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from messaging import opt_ins
from messaging.api.serializers import (
    MAX_VARIABLE_NAME_LENGTH,
    MAX_VARIABLE_VALUE_LENGTH,
    MAX_VARIABLES,
)
from messaging.models import IdempotencyRecord, Message, MessageEvent, OptIn, OutboxEntry
from messaging.rules import MAX_RENDERED_LENGTH
from pilot_status.jsonbody import MAX_DEPTH

SEND = "/v1/messages/send"
TO = "+5511988887777"


def encoded(data: Any) -> bytes:
    # json.dumps escapes a lone surrogate as \ud800, as a client's JSON library would.
    return json.dumps(data).encode()


def send_body(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"to": TO, "category": "UTILITY", "text": "Hello {{name}}", "variables": {"name": "Ana"}}
    data.update(changes)
    return data


def stored() -> tuple[int, ...]:
    return (
        Message.objects.count(),
        MessageEvent.objects.count(),
        OutboxEntry.objects.count(),
        IdempotencyRecord.objects.count(),
        OptIn.objects.count(),
    )


def assert_envelope(response: Any, status: int, *codes: str) -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    if codes:
        assert error["code"] in codes, error
    return dict(error)


def post(client: Any, url: str, raw: bytes, **headers: Any) -> Any:
    return client.post(url, data=raw, content_type="application/json", **headers)


def call(client: Any, method: str, url: str, raw: bytes = b"{}") -> Any:
    if method == "get":
        return client.get(url)
    return getattr(client, method)(url, data=raw, content_type="application/json")


@pytest.fixture
def opted_in(alice: Any) -> None:
    opt_ins.record(alice.project, TO, "checkout")


# ---- 1. the rendered text --------------------------------------------------------------------


def test_the_issues_amplification_is_refused_and_nothing_is_stored(alice, alice_instance, opted_in):
    # 64 KB on the wire, 48,000,000 characters once rendered: it used to be accepted and stored.
    raw = encoded(send_body(text="{{v}}" * 800, variables={"v": "x" * 60_000}))
    assert len(raw) <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    before = stored()

    error = assert_envelope(post(alice.client(), SEND, raw), 400, "invalid_request")

    assert set(error["details"]["fields"]) & {"text", "variables"}
    assert stored() == before


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_text_that_renders_past_the_limit_is_400_naming_text(alice, alice_instance, opted_in, idempotent):
    value = "y" * 100
    data = send_body(text="{{v}}" * 41, variables={"v": value})  # 4,100 characters rendered
    headers = {"HTTP_IDEMPOTENCY_KEY": "render-1"} if idempotent else {}
    before = stored()

    error = assert_envelope(alice.client().post(SEND, data, format="json", **headers), 400, "invalid_request")

    assert list(error["details"]["fields"]) == ["text"]
    assert str(MAX_RENDERED_LENGTH) in error["details"]["fields"]["text"][0]
    assert stored() == before


@pytest.mark.parametrize(
    "text, variables",
    [
        ("{{n}}" * 820, {"n": 12345}),  # numbers render as their text: 4,100
        ("{{b}} " * 683, {"b": False}),  # "False " * 683 = 4,098
        ("{{ a }}{{b}}" + "z" * 4000, {"a": "a" * 50, "b": "b" * 50}),
    ],
)
def test_numbers_booleans_and_several_variables_count_as_rendered(alice, alice_instance, opted_in, text, variables):
    response = alice.client().post(SEND, send_body(text=text, variables=variables), format="json")
    assert "text" in assert_envelope(response, 400, "invalid_request")["details"]["fields"]
    assert Message.objects.count() == 0


def test_a_text_that_renders_to_exactly_the_limit_is_accepted(alice, alice_instance, opted_in):
    text = "{{v}}" * 40 + "x" * 96
    response = alice.client().post(SEND, send_body(text=text, variables={"v": "y" * 100}), format="json")

    assert response.status_code == 202, response.content
    assert len(Message.objects.get().text) == MAX_RENDERED_LENGTH == 4096


@pytest.mark.parametrize(
    "variables",
    [
        {"name": "Ana", "long": "v" * (MAX_VARIABLE_VALUE_LENGTH + 1)},  # unused, still bounded
        {"name": "Ana", **{f"v{i}": i for i in range(MAX_VARIABLES)}},
        {"name": "Ana", "n" * (MAX_VARIABLE_NAME_LENGTH + 1): 1},
    ],
    ids=["value", "count", "name"],
)
def test_variable_values_names_and_count_are_bounded(alice, alice_instance, opted_in, variables):
    response = alice.client().post(SEND, send_body(variables=variables), format="json")
    assert list(assert_envelope(response, 400, "invalid_request")["details"]["fields"]) == ["variables"]
    assert Message.objects.count() == 0


def test_the_bounds_themselves_are_accepted(alice, alice_instance, opted_in):
    variables = {f"v{i}": i for i in range(MAX_VARIABLES - 2)}
    variables["name"] = "n" * MAX_VARIABLE_VALUE_LENGTH
    variables["n" * MAX_VARIABLE_NAME_LENGTH] = 1
    response = alice.client().post(SEND, send_body(text="{{name}}", variables=variables), format="json")
    assert response.status_code == 202, response.content


# ---- 2. bodies that are not JSON we take -------------------------------------------------------

DEEP = 5_000

BAD_JSON = {
    "deep array in a field": b'{"to":' + b"[" * DEEP + b"]" * DEEP + b"}",
    "deep array": b"[" * DEEP + b"]" * DEEP,
    "deep object": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    "just past the depth bound": encoded(send_body(metadata=json.loads('{"a":' * MAX_DEPTH + "1" + "}" * MAX_DEPTH))),
    "4,000-digit integer": b'{"to":"' + TO.encode() + b'","category":"UTILITY","text":"{{a}}","variables":{"a":'
    + b"9" * 4_000 + b"}}",
    "5,000-digit integer": b'{"variables":{"a":' + b"9" * 5_000 + b"}}",
    "100-digit decimal": b'{"metadata":{"a":1.' + b"0" * 100 + b"}}",
    "huge exponent": b'{"metadata":{"a":1e999999}}',
    "NaN": b'{"metadata":{"a":NaN}}',
    "Infinity": b'{"metadata":{"a":-Infinity}}',
    "truncated UTF-8": b'{"to":"\xc3',
    "truncated UTF-8 in a string": b'{"text":"\xe2\x82"}',
    "invalid UTF-8": b'{"text":"\xff\xfe"}',
    "UTF-8-encoded surrogate": b'{"text":"\xed\xa0\x80"}',
    "UTF-16 with a BOM": '{"text":"x"}'.encode("utf-16"),
    "UTF-8 BOM": b'\xef\xbb\xbf{"text":"x"}',
    "truncated JSON": b'{"to":"+55',
    "NUL byte outside strings": b'{"to"\x00:1}',
    "empty object key surrogate": b'{"\\ud800":1}',
    "array": b"[1,2]",
    "string": b'"text"',
    "number": b"12",
    "null": b"null",
    "true": b"true",
}


@pytest.mark.parametrize("name", list(BAD_JSON))
@pytest.mark.parametrize("idempotent", [False, True], ids=["", "idempotency-key"])
def test_a_send_body_we_do_not_take_is_400(alice, alice_instance, opted_in, name, idempotent):
    headers = {"HTTP_IDEMPOTENCY_KEY": f"bad-{name}"} if idempotent else {}
    before = stored()
    response = post(alice.client(), SEND, BAD_JSON[name], **headers)
    assert_envelope(response, 400, "invalid_json", "invalid_request")
    assert stored() == before


@pytest.mark.parametrize("name", list(BAD_JSON))
@pytest.mark.parametrize("url", ["/v1/opt-ins", "/v1/dead-letters/1/resend", "/v1/dead-letters/1/dismiss"])
def test_every_body_endpoint_answers_400_to_them(alice, url, name):
    before = stored()
    response = post(alice.client(), url, BAD_JSON[name])
    if url.startswith("/v1/dead-letters/") and name == "null":
        assert_envelope(response, 404, "not_found")  # the body is optional there: null is no body
    else:
        assert_envelope(response, 400, "invalid_json", "invalid_request")
    assert stored() == before


def test_a_deep_body_names_the_bound(alice, alice_instance):
    error = assert_envelope(post(alice.client(), SEND, BAD_JSON["deep array"]), 400, "invalid_json")
    assert str(MAX_DEPTH) in error["message"]


def test_a_charset_that_is_not_text_is_refused(alice, alice_instance):
    response = alice.client().post(SEND, data=b"x", content_type="application/json; charset=bz2_codec")
    assert_envelope(response, 400, "invalid_json")


# ---- 3. a wrong value in every field -----------------------------------------------------------

ANY_WRONG: list[Any] = [1, -1, 1.5, 10**30, True, False, [], ["x"], {}, {"a": 1}, "\ud800", "a\udfffb", "\x00"]

WRONG_SEND = {
    "to": [*ANY_WRONG, None, "", 5511988887777, TO + "\x00", "+" + "5" * 5000, "x" * 5000, "+５５１１９８８８８７７７７x"],
    "category": [*ANY_WRONG, None, "", "utility", "UTILITY\x00", "x" * 5000],
    "text": [*ANY_WRONG, None, "", "   ", "x" * 5000],
    "variables": [1, True, "x", [], ["name"], {"name": None}, {"name": []}, {"name": {"a": 1}}, {"name": "\ud800"},
                  {"name": "\x00"}, {"name": "Ana", "\ud800": 1}, {"name": "Ana", "a\x00": 1}, {}],
    "instance": [*ANY_WRONG, "", "  ", "x" * 5000],
    "deliverUntil": [*ANY_WRONG, "", "soon", "2026-13-45T00:00:00Z", "9999-12-31T23:59:59Z",
                     "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "1" * 40, "x" * 5000],
    "priority": [*ANY_WRONG, "", "URGENT", "x" * 5000],
    "metadata": [1, True, "x", [], [1], {"\ud800": 1}, {"a": "\ud800"}, {"a": "\x00"}, {"\x00": 1},
                 {"a": ["b", {"c": "\udc00"}]}, {"big": "x" * 5000}],
    "\ud800": [1],
    "\x00": [1],
    "": [1],
}


def shown(name: str) -> str:
    # An unknown field's name is echoed in the error; a lone surrogate there is shown escaped.
    return name.encode("utf-8", "backslashreplace").decode()


def _cases(table: dict[str, list[Any]]) -> list[Any]:
    return [pytest.param(field, value, id=f"{field!r}={value!r}"[:60]) for field, values in table.items() for value in values]


@pytest.mark.parametrize("field, value", _cases(WRONG_SEND))
def test_a_wrong_value_in_any_send_field_is_400_naming_it(alice, alice_instance, opted_in, field, value):
    before = stored()
    response = post(alice.client(), SEND, encoded(send_body(**{field: value})))
    fields = assert_envelope(response, 400, "invalid_request")["details"]["fields"]
    assert shown(field) in fields, fields
    assert stored() == before


WRONG_OPT_IN = {
    "phone": [*ANY_WRONG, None, "", "+551", TO + "\x00", "+" + "5" * 5000, "x" * 5000],
    "source": [*ANY_WRONG, None, "x" * 201, "x" * 5000],
    "\ud800": [1],
    "extra": [None],
}


@pytest.mark.parametrize("field, value", _cases(WRONG_OPT_IN))
def test_a_wrong_value_in_any_opt_in_field_is_400_naming_it(alice, field, value):
    data = {"phone": TO, "source": "checkout", field: value}
    response = post(alice.client(), "/v1/opt-ins", encoded(data))
    assert shown(field) in assert_envelope(response, 400, "invalid_request")["details"]["fields"]
    assert OptIn.objects.count() == 0


@pytest.mark.parametrize("value", [*ANY_WRONG, "soon", "x" * 5000])
def test_a_wrong_deliver_until_on_a_resend_is_400(alice, value):
    response = post(alice.client(), "/v1/dead-letters/1/resend", encoded({"deliverUntil": value}))
    assert "deliverUntil" in assert_envelope(response, 400, "invalid_request")["details"]["fields"]


# ---- 4. credentials and headers --------------------------------------------------------------

READS = ["/v1/messages", "/v1/instances", "/v1/dead-letters", "/v1/messages/00000000-0000-0000-0000-000000000000"]

BAD_AUTHORIZATION = [
    "Bearer ps_live_é",
    "Bearer ps_live_\x00",
    "Bearer \x00",
    "\x00",
    "Bearer ps_live_" + "x" * 10_000,
    "Bearer ps_live_" + "\udc80",
    "Bearer ps_live_\xff\xfe",
    "Bearér ps_live_x",
    "Bearer",
    "Bearer ",
    "ps_live_x",
    "Basic dXNlcjpwYXNz",
    "Bearer ps_live_x ps_live_y",
    "Bearer ps_live_\t\r",
]


@pytest.mark.parametrize("header", BAD_AUTHORIZATION, ids=lambda h: repr(h)[:40])
@pytest.mark.parametrize("method, url", [("post", SEND), ("post", "/v1/opt-ins"), *[("get", u) for u in READS],
                                         ("delete", f"/v1/opt-ins/{TO}"), ("post", "/v1/dead-letters/1/dismiss")])
def test_junk_credentials_are_401(alice, alice_instance, header, method, url):
    client = alice.client()
    client.credentials(HTTP_AUTHORIZATION=header)
    before = stored()
    response = call(client, method, url, encoded(send_body()))
    assert_envelope(response, 401, "unauthorized")
    assert response["WWW-Authenticate"] == "Bearer"
    assert stored() == before


BAD_IDEMPOTENCY_KEYS = ["\x00", "key\x00", "é", "ключ", "\udc80", "tab\there", "x" * 256, "x" * 100_000, "\x7f", "line\nbreak"]


@pytest.mark.parametrize("key", BAD_IDEMPOTENCY_KEYS, ids=lambda k: repr(k)[:30])
def test_a_junk_idempotency_key_is_400_naming_it(alice, alice_instance, opted_in, key):
    before = stored()
    response = alice.client().post(SEND, send_body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    error = assert_envelope(response, 400, "invalid_request")
    assert "idempotencyKey" in error["details"]["fields"]
    assert stored() == before


def test_a_visible_ascii_idempotency_key_still_works(alice, alice_instance, opted_in):
    key = "order-7:retry/1 " + "~" * 200
    first = alice.client().post(SEND, send_body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    again = alice.client().post(SEND, send_body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.json()["id"] == again.json()["id"]


@pytest.mark.parametrize(
    "content_type",
    # A NUL in the charset is left to the server: Django's WSGIRequest raises ValueError on it
    # before any middleware, and gunicorn refuses control characters in headers first (400; see
    # the gunicorn test below).
    ["application/json; charset=é", "application/json; charset=" + "x" * 5000,
     "application/\x00json", "text/plain", "application/json; charset=utf-16", "é/é"],
    ids=lambda c: repr(c)[:30],
)
def test_a_junk_content_type_is_a_4xx(alice, alice_instance, content_type):
    response = alice.client().post(SEND, data=encoded(send_body()), content_type=content_type)
    assert 400 <= response.status_code < 500, response.content
    assert set(response.json()["error"]) == {"code", "message", "details"}
    assert Message.objects.count() == 0


@pytest.mark.parametrize("accept", ["\x00", "é/é", "text/html", "application/json; q=" + "9" * 5000, ";;;,,,"])
def test_a_junk_accept_header_is_not_a_5xx(alice, accept):
    response = alice.client().get("/v1/instances", HTTP_ACCEPT=accept)
    assert response.status_code in (200, 406), response.content


# ---- 5. query and path parameters ------------------------------------------------------------


def _b64(raw: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


BAD_QUERIES = [
    "status=%00", "status=SENT%00", "status=%ED%A0%80", "status=" + "x" * 5000, "category=%C3", "to=%00",
    "to=%2B%EF%BC%95%EF%BC%95", "to=" + "9" * 5000, "createdAfter=garbage", "createdAfter=0001-01-01T00:00:00%2B14:00",
    "createdBefore=9999-12-31T23:59:59-14:00", "createdAfter=%00", "limit=-1", "limit=0", "limit=1.5", "limit=" + "9" * 5000,
    "limit=%00", "limit=%D9%A1", "cursor=%00", "cursor=!!!", "cursor=" + "A" * 5000, "cursor=" + _b64(b"\xff\xfe|x"),
    "cursor=" + _b64(b"2026-01-01T00:00:00+00:00|not-a-uuid"), "cursor=" + _b64(b"9999-99-99|1"),
    "cursor=" + _b64(b"2026-01-01T00:00:00+00:00|" + b"9" * 5000), "cursor=" + _b64("2026-01-01T00:00:00+00:00|²".encode()),
    "cursor=" + _b64(b"2026-01-01T00:00:00+00:00|99999999999999999999999"), "unknown=1", "%00=1", "%ED%A0%80=1",
    "reason=%00",
]


# The few that are not junk after all, and the page each one reads as (rows of the list's one row).
READ_AS_A_PAGE = {
    # DRF's IntegerField reads the Arabic-Indic digit one as 1.
    ("/v1/messages", "limit=%D9%A1"): 1,
    ("/v1/dead-letters", "limit=%D9%A1"): 1,
    # A dead letter's cursor id is a number: this one is past every row (a message's is a UUID: 400).
    ("/v1/dead-letters", "cursor=" + _b64(b"2026-01-01T00:00:00+00:00|99999999999999999999999")): 0,
}


@pytest.mark.parametrize("url", ["/v1/messages", "/v1/dead-letters"])
@pytest.mark.parametrize("query", BAD_QUERIES, ids=lambda q: q[:40])
def test_junk_query_parameters_are_a_400(alice, alice_instance, url, query):
    """A 400 in the envelope, except the queries of READ_AS_A_PAGE: each of those answers exactly its
    page. The project has one row on each list, so that an empty page is an answer, not the only one."""
    from tests.messaging.test_resend import failed_message

    opt_ins.record(alice.project, TO, "checkout")
    failed_message(alice, to=TO)
    response = alice.client().get(f"{url}?{query}")
    if (url, query) in READ_AS_A_PAGE:
        assert response.status_code == 200, response.content[:500]
        assert len(response.json()["data"]) == READ_AS_A_PAGE[url, query]
    else:
        assert_envelope(response, 400, "invalid_request")


@pytest.mark.parametrize("url", ["/v1/messages", "/v1/dead-letters", "/v1/instances"])
def test_more_query_parameters_than_django_reads_is_400(alice, url):
    # DATA_UPLOAD_MAX_NUMBER_FIELDS: Django refuses to parse the query (TooManyFieldsSent).
    query = "&".join(f"k{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    error = assert_envelope(alice.client().get(f"{url}?{query}"), 400, "invalid_request")
    assert error["details"] == {"limit": settings.DATA_UPLOAD_MAX_NUMBER_FIELDS}


BAD_PATHS = [
    ("get", "/v1/messages/not-a-uuid"),
    ("get", "/v1/messages/%00"),
    ("get", "/v1/messages/" + "0" * 5000),
    ("get", "/v1/messages/%ED%A0%80"),
    ("delete", "/v1/opt-ins/%00"),
    ("delete", "/v1/opt-ins/%2B5511988887777%00"),
    ("delete", "/v1/opt-ins/%ED%A0%80"),
    ("delete", "/v1/opt-ins/%C3"),
    ("delete", "/v1/opt-ins/%2B%EF%BC%95%EF%BC%95%EF%BC%91%EF%BC%91"),  # fullwidth digits
    ("delete", "/v1/opt-ins/%D9%A5%D9%A5"),  # Arabic-Indic digits
    ("delete", "/v1/opt-ins/" + "9" * 5000),
    ("delete", "/v1/opt-ins/%2B" + "5" * 300),
    ("delete", "/v1/opt-ins/junk"),
    ("post", "/v1/dead-letters/99999999999999999999999/resend"),
    ("post", "/v1/dead-letters/" + "9" * 5000 + "/dismiss"),
    ("post", "/v1/dead-letters/%C2%B2/resend"),
    ("post", "/v1/dead-letters/-1/resend"),
]


@pytest.mark.parametrize("method, path", BAD_PATHS, ids=lambda p: p[:40] if isinstance(p, str) else p)
def test_junk_path_parameters_are_404(alice, method, path):
    opt_ins.record(alice.project, TO, "form")
    response = call(alice.client(), method, path)
    assert_envelope(response, 404, "not_found")
    assert OptIn.objects.get().revoked_at is None


def test_revoking_with_another_scripts_digits_finds_the_same_number(alice):
    # PhoneField reads digits of any script, so the path does too: the same number, not a 5xx.
    opt_ins.record(alice.project, TO, "form")
    fullwidth = "+" + "".join(chr(ord("０") + int(d)) for d in TO[1:])
    assert alice.client().delete(f"/v1/opt-ins/{fullwidth}").status_code == 200


def test_refused_instance_names_are_not_remembered(alice, alice_instance, opted_in):
    # The process remembers each (project, named instance)'s candidates (messaging.remembered);
    # a name that is not the project's is refused on fresh facts anyway, and must not fill it.
    from messaging import remembered

    before = len(remembered._seen)
    for i in range(50):
        response = alice.client().post(SEND, send_body(instance=f"not-ours-{i}"), format="json")
        assert_envelope(response, 422, "unknown_instance")
    assert len(remembered._seen) == before
    assert alice.client().post(SEND, send_body(instance="alice-main"), format="json").status_code == 202
    assert len(remembered._seen) == before + 1


# ---- 6. the same bodies through gunicorn -----------------------------------------------------


class Gunicorn:
    """One gunicorn web process (the client API's pool as the Procfile runs it) on the test database."""

    def __init__(self) -> None:
        from tests.support.processes import free_port, test_database_url

        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "pilot_status.wsgi:application", "-b", f"127.0.0.1:{self.port}",
             "-w", "1", "--timeout", "30", "--graceful-timeout", "5"],
            env={**os.environ, "DATABASE_URL": test_database_url(), "API_KEY_CACHE_SECONDS": "0"},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )

    def request(self, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
        """Send raw bytes (a client library would refuse half of these headers); the status and body."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            sock.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        if b"transfer-encoding: chunked" in head.lower():
            body = _dechunk(body)
        return int(head.split(None, 2)[1]), body


def _dechunk(raw: bytes) -> bytes:
    body = b""
    while raw:
        size, _, raw = raw.partition(b"\r\n")
        length = int(size.split(b";")[0], 16)
        if length == 0:
            break
        body, raw = body + raw[:length], raw[length + 2:]
    return body


@pytest.fixture(scope="module")
def served(django_db_setup: Any, django_db_blocker: Any) -> Iterator[tuple[Gunicorn, Any]]:
    """gunicorn, and alice with her instance and an opt-in committed for it to see.

    Committed once for the module (a flush per test would cost more than the requests), and
    flushed at the end; each test compares what is stored before and after its requests."""
    from django.core.management import call_command

    from tests.conftest import add_instance, make_actor
    from tests.support.processes import wait_for_port

    with django_db_blocker.unblock():
        alice = make_actor("Alice Store", "+5511999990001")
        add_instance(alice.project, "alice-main")
        opt_ins.record(alice.project, TO, "checkout")
    server = Gunicorn()
    try:
        wait_for_port(server.port, proc=server.proc)
        yield server, alice
    finally:
        server.proc.terminate()
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)


def _head(method: str, path: str, key: str, extra: bytes = b"") -> bytes:
    content_type = b"" if extra.startswith(b"Content-Type:") else b"Content-Type: application/json\r\n"
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n".encode() + content_type + extra


# Control characters in a header: gunicorn refuses the request itself (400, plain text) before
# Django sees it (gunicorn.http.message).
RFC9110_5_5_INVALID_AND_DANGEROUS = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")

HOSTILE_OVER_HTTP = {
    **{f"body: {name}": (SEND, b"", raw) for name, raw in BAD_JSON.items()},
    "body: amplification": (SEND, b"", encoded(send_body(text="{{v}}" * 800, variables={"v": "x" * 60_000}))),
    "body: renders past 4096": (SEND, b"", encoded(send_body(text="{{v}}" * 41, variables={"v": "y" * 100}))),
    "body: surrogate text": (SEND, b"", encoded(send_body(text="\ud800"))),
    "body: NUL text": (SEND, b"", encoded(send_body(text="a\x00b"))),
    "body: surrogate category": (SEND, b"", encoded(send_body(category="\udfff"))),
    "body: surrogate field name": (SEND, b"", encoded({**send_body(), "\ud800": 1})),
    "body: text as a number": (SEND, b"", encoded(send_body(text=12345))),
    "body: wrong types": (SEND, b"", encoded({"to": [], "category": {}, "text": 1, "variables": "x", "priority": True})),
    "opt-in: deep": ("/v1/opt-ins", b"", BAD_JSON["deep object"]),
    "opt-in: surrogate source": ("/v1/opt-ins", b"", encoded({"phone": TO, "source": "\ud800"})),
    "resend: deep": ("/v1/dead-letters/1/resend", b"", BAD_JSON["deep array"]),
    "header: idempotency NUL": (SEND, b"Idempotency-Key: a\x00b\r\n", encoded(send_body())),
    "header: idempotency latin-1": (SEND, b"Idempotency-Key: \xe9\xff\r\n", encoded(send_body())),
    "header: idempotency UTF-8": (SEND, "Idempotency-Key: ключ\r\n".encode(), encoded(send_body())),
    "header: idempotency 8 KB": (SEND, b"Idempotency-Key: " + b"k" * 8000 + b"\r\n", encoded(send_body())),
    "header: idempotency and a deep body": (SEND, b"Idempotency-Key: deep-1\r\n", BAD_JSON["deep array"]),
    "header: charset NUL": (SEND, b"Content-Type: application/json; charset=\x00\r\n", encoded(send_body())),
    "header: charset bz2": (SEND, b"Content-Type: application/json; charset=bz2_codec\r\n", b"BZh9"),
}


@pytest.mark.stack
@pytest.mark.django_db  # reads at READ COMMITTED: gunicorn's commits are what is counted
@pytest.mark.parametrize("case", list(HOSTILE_OVER_HTTP))
def test_gunicorn_answers_hostile_requests_with_a_4xx_and_stores_nothing(served, case):
    server, alice = served
    path, extra, body = HOSTILE_OVER_HTTP[case]
    before = stored()

    status, answer = server.request(_head("POST", path, alice.live_key, extra), body)

    assert 400 <= status < 500, (status, answer[:300])
    if not RFC9110_5_5_INVALID_AND_DANGEROUS.search(extra):  # else gunicorn answers, in plain text
        assert set(json.loads(answer)["error"]) == {"code", "message", "details"}
    assert stored() == before


JUNK_CREDENTIALS = [b"Bearer ps_live_\xe9", b"Bearer ps_live_\x00", b"Bearer ps_live_" + b"x" * 8000, b"Bearer \xff\xfe",
                    b"\x80", b"Bearer ps_live_\xed\xa0\x80"]


@pytest.mark.stack
@pytest.mark.django_db  # reads at READ COMMITTED: gunicorn's commits are what is counted
def test_gunicorn_answers_junk_credentials_with_a_4xx(served):
    server, _ = served
    before = stored()
    for authorization in JUNK_CREDENTIALS:
        head = (b"POST /v1/messages/send HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Authorization: " + authorization + b"\r\n")
        status, answer = server.request(head, encoded(send_body()))
        assert 400 <= status < 500, (authorization[:40], status, answer[:300])
        if not RFC9110_5_5_INVALID_AND_DANGEROUS.search(authorization):
            assert json.loads(answer)["error"]["code"] == "unauthorized"
    assert stored() == before


JUNK_TARGETS = [
    "/v1/messages?status=%00", "/v1/messages?cursor=%FF%FE", "/v1/messages?limit=" + "9" * 3000, "/v1/messages/%00",
    "/v1/messages/%ED%A0%80", "/v1/opt-ins/%00", "/v1/opt-ins/%2B5511988887777%00", "/v1/opt-ins/%ED%A0%80",
    "/v1/opt-ins/" + "9" * 3000, "/v1/dead-letters?cursor=" + "A" * 3000, "/v1/dead-letters/99999999999999999999999/dismiss",
    "/v1/messages?" + "a&" * 1001,
]


@pytest.mark.stack
@pytest.mark.django_db  # reads at READ COMMITTED: gunicorn's commits are what is counted
def test_gunicorn_answers_junk_queries_and_paths_with_a_4xx(served):
    server, alice = served
    for target in JUNK_TARGETS:
        method = "DELETE" if target.startswith("/v1/opt-ins/") else "POST" if target.endswith("/dismiss") else "GET"
        status, answer = server.request(_head(method, target, alice.live_key), b"{}" if method == "POST" else b"")
        assert 400 <= status < 500, (target[:60], status, answer[:300])
        assert set(json.loads(answer)["error"]) == {"code", "message", "details"}
    assert OptIn.objects.get().revoked_at is None


@pytest.mark.stack
@pytest.mark.django_db  # reads at READ COMMITTED: gunicorn's commits are what is counted
def test_gunicorn_still_accepts_a_good_send(served):
    server, alice = served
    before = Message.objects.count()
    status, answer = server.request(_head("POST", SEND, alice.live_key), encoded(send_body()))
    assert status == 202, answer
    assert Message.objects.count() == before + 1
    assert Message.objects.get(pk=json.loads(answer)["id"]).text == "Hello Ana"
