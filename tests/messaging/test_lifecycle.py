"""One state machine for a message (issue 46): messaging.lifecycle's table is the one the database holds, each
of its moves is a function there, the module reads in one screen-set, and no other module of the product writes a
message's status.

The scan reads the product's source (not bench's or chaos's harnesses, which make messages in a status on
purpose, nor the tests) and fails on every way a status is written that it knows: an ORM update, create or save
of a message's status, a raw `UPDATE messaging_message SET status` or `INSERT INTO messaging_message`, a change
of a message's `status` attribute, and a call of the SQL helpers the lifecycle's moves are written with.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from messaging import lifecycle, writes
from messaging.models import Message, Status

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("messaging", "ingestion", "callbacks", "dashboard", "pilot_status", "simulator")
# The lifecycle, and the modules that turn its moves into SQL (they know no status).
LIFECYCLE = {"messaging/lifecycle.py", "messaging/writes.py", "messaging/inserts.py"}
# What messaging.writes offers anyone: loading rows, finding a message, counting lines. Everything else there is
# SQL a move is written with, which only the lifecycle may call (a new helper is the lifecycle's unless listed here).
WRITES_FOR_ANYONE = {"load", "message_by_evolution_id", "count_timeline"}
HELPERS = {name for name, function in inspect.getmembers(writes, inspect.isfunction)
           if function.__module__ == writes.__name__ and not name.startswith("_")} - WRITES_FOR_ANYONE | {"insert_rows"}
CREATING = {"create", "bulk_create", "get_or_create", "update_or_create"}

_UPDATE = re.compile(r'\bUPDATE\s+"?messaging_message"?\s+(?:(?:AS\s+)?\w+\s+)?SET\b(?P<set>.*?)(?:\bWHERE\b|\bFROM\b|\bRETURNING\b|$)',
                     re.IGNORECASE | re.DOTALL)
_SETS_STATUS = re.compile(r'(?:^|,)\s*(?:\w+\.)?"?status"?\s*=', re.IGNORECASE)
_MESSAGE_NAME = re.compile(r"(\w+_)?messages?")
_INSERT = re.compile(r'\bINSERT\s+INTO\s+"?messaging_message"?\s*\(', re.IGNORECASE)


def _root(node: ast.expr) -> ast.expr:
    """The start of a chain: `Message` in Message.objects.filter(...).update(...)."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _chain(node: ast.expr) -> list[str]:
    """The names along a chain: ["entry", "message"] for entry.message, ["Message", "objects", "filter"] for
    Message.objects.filter(...)."""
    names: list[str] = []
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def _sql_text(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    return None


def _names(node: ast.expr) -> set[str]:
    """String constants in a list, tuple or set literal (update_fields=[...], fields=[...])."""
    return {item.value for item in getattr(node, "elts", []) if isinstance(item, ast.Constant)}


def status_writes(source: str) -> Iterator[tuple[int, str]]:
    """Every place in `source` that writes a message's status as far as the scan can tell: (line, what)."""
    tree = ast.parse(source)
    # Names bound to a message query or row (rows = Message.objects.filter(...)), and those that say so.
    bound = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name)
             and isinstance(root := _root(node.value), ast.Name) and root.id == "Message"}

    def is_message(node: ast.expr) -> bool:
        """A message, or a query of messages: the chain names one (`message`, `entry.message`, `Message.objects`)."""
        return any(name == "Message" or name in bound or _MESSAGE_NAME.fullmatch(name.lower())
                   for name in _chain(node))

    for node in ast.walk(tree):
        text = _sql_text(node) if isinstance(node, ast.expr) else None
        if text is not None:
            if any(_SETS_STATUS.search(part) for match in _UPDATE.finditer(text)
                   for part in _split_set(match["set"])):
                yield node.lineno, "raw SQL sets messaging_message.status"
            if _INSERT.search(text):
                yield node.lineno, "raw SQL inserts into messaging_message"
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "status" and is_message(target.value):
                    yield node.lineno, "assigns a message's status"
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        keywords = {keyword.arg for keyword in node.keywords}
        if name in HELPERS:
            yield node.lineno, f"calls {name}, the lifecycle's SQL helper"
        elif name == "setattr" and len(node.args) > 1 and _sql_text(node.args[1]) == "status" and is_message(node.args[0]):
            yield node.lineno, "sets a message's status"
        elif isinstance(func, ast.Name) and func.id == "Message" and "status" in keywords:
            yield node.lineno, "makes a message in a status"
        elif not isinstance(func, ast.Attribute) or not is_message(func.value):
            continue
        elif name in CREATING and "Message" in _chain(func.value):
            yield node.lineno, f"{name} of a message: a new message enters through lifecycle.accept"
        elif name in ("update", *CREATING) and ("status" in keywords or None in keywords):
            yield node.lineno, f"{name} of a message's status" + (" (or of anything, **)" if None in keywords else "")
        elif name == "bulk_update" and any("status" in _names(k.value) for k in node.keywords) | (
                len(node.args) > 1 and "status" in _names(node.args[1])):
            yield node.lineno, "bulk_update of messages' status"
        elif name == "save" and not any(k.arg == "update_fields" and "status" not in _names(k.value)
                                        for k in node.keywords):
            yield node.lineno, "save() of a message writes its status"


def _split_set(assignments: str) -> list[str]:
    """A SET list's assignments, split at the commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in assignments:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def product_modules() -> Iterator[Path]:
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in relative and relative not in LIFECYCLE:
                yield path


def test_no_module_but_the_lifecycle_writes_a_status():
    found = [f"{path.relative_to(ROOT)}:{line}: {what}"
             for path in product_modules() for line, what in status_writes(path.read_text())]
    assert found == []


WRITES = [
    'Message.objects.filter(pk=1).update(status="SENT")',
    "rows = Message.objects.filter(pk=1)\nrows.update(status=Status.QUEUED)",
    "Message.objects.filter(pk=1).update(**changes)",
    'Message.objects.filter(pk=1).update(**{"status": "READ"})',
    'Message.objects.create(project=project, status="FAILED")',
    "Message.objects.bulk_create(messages)",
    'Message(project=project, status="SENT")',
    'message.status = "SENT"\nmessage.save()',
    'setattr(message, "status", "SENT")',
    "message.save()",
    'message.save(update_fields=["status", "updated_at"])',
    'Message.objects.bulk_update(messages, ["status"])',
    'cursor.execute("UPDATE messaging_message SET status = %s WHERE id = %s", [new, pk])',
    "cursor.execute(\"UPDATE messaging_message SET attempts = 1, status = 'SENT' WHERE id = %s\")",
    'sql = """\nUPDATE messaging_message m\n   SET "status" = %s\n WHERE m.id = %s"""',
    'f"UPDATE messaging_message SET status = {target} WHERE id = %s"',
    'cursor.execute("INSERT INTO messaging_message (id, status) VALUES (%s, %s)")',
    'writes.compare_and_set(pk, ["SENT"], None, {"status": "READ"})',
    'writes.update_if(pk, ["QUEUED"], None, status="FAILED")',
    'writes.claim_row(pk, "QUEUED", "SENDING", token, now, now, until, own_id, extra="")',
    'writes.release_rows(ids, "QUEUED", now, "DISPATCHED", {})',
]
NOT_WRITES = [
    'DeadLetter.objects.filter(pk=1).update(status="RESENT")',
    "Message.objects.filter(pk=1).update(status_checked_at=now)",
    'Message.objects.filter(status="QUEUED").count()',
    'job.status = "DONE"\njob.save()',
    'message.save(update_fields=["hold_reason"])',
    '"UPDATE messaging_message SET dispatched_at = CASE WHEN status = %s THEN now() END WHERE id = %s"',
    '"UPDATE messaging_message SET dispatched_at = COALESCE(dispatched_at, now()), hold_reason = NULL WHERE status = %s"',
    '"INSERT INTO messaging_messageevent (message_id, kind) VALUES (%s, %s)"',
    'lifecycle.advance(message, "READ")',
    'lifecycle.release(ids, "utility", now)',
    "writes.load(Message, row)",
    "writes.count_timeline(lines, category)",
]


@pytest.mark.parametrize("source", WRITES)
def test_the_scan_finds_a_status_write(source):
    assert list(status_writes(source)), source


@pytest.mark.parametrize("source", NOT_WRITES)
def test_the_scan_leaves_other_writes_alone(source):
    assert list(status_writes(source)) == [], source


def test_the_lifecycle_reads_in_one_screen_set():
    """States, table and every move's function in at most 300 lines: the SQL lives in messaging.writes and helper
    concerns in modules of their own (messaging.holds), so that the whole life of a message fits one reading."""
    lines = (ROOT / "messaging" / "lifecycle.py").read_text().splitlines()
    assert len(lines) <= 300, f"messaging/lifecycle.py has {len(lines)} lines"


def test_the_scan_knows_the_sql_helpers_of_the_moves():
    assert {"compare_and_set", "compare_and_set_ctes", "update_if", "changed_with_relations", "claim_row",
            "release_rows", "hold_rows", "flag_unacknowledged_rows", "insert_rows"} <= HELPERS
    assert not HELPERS & WRITES_FOR_ANYONE


def test_every_move_of_the_table_is_a_function_of_the_lifecycle():
    assert all(callable(getattr(lifecycle, move.name, None)) for move in lifecycle.MOVES)


class _Undo(Exception):
    pass


def test_the_trigger_allows_the_moves_of_the_table_and_no_other(alice, alice_instance):
    """The table is the state machine; the trigger `message_status_order` holds it for every UPDATE, a raw one too."""
    table = {(source.value, move.target.value) for move in lifecycle.MOVES if move.target
             for source in move.sources if source != move.target}
    allowed = set()
    for old in Status:
        message = Message.objects.create(
            project=alice.project, environment="LIVE", category="UTILITY", to="+5511988887777", template="hi",
            text="hi", instance=alice_instance, deliver_until=timezone.now() + timedelta(hours=1), status=old,
        )
        for new in Status:
            if new == old:
                continue
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("UPDATE messaging_message SET status = %s WHERE id = %s", [new.value, message.pk])
                    raise _Undo  # allowed: undone, so that the message is `old` again for the next one
            except _Undo:
                allowed.add((old.value, new.value))
            except IntegrityError as refused:
                assert "message_status_order" in str(refused) or "may not move" in str(refused)
    assert allowed == table
