"""The accept funnel's read and judgement: everything the checks need, in one query (issue 7, B1).

One SELECT reads whether the API key is still active, the stored answer for the Idempotency-Key and
the opt-in (both of the key's environment: the sandbox rule) and the best candidate instance of each group; judge() then applies the contract's
checks in order (plain functions in `rules`). messaging.accept writes on what they decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connection

from pilot_status.database import checking_connection

from . import rules, writes
from .errors import Rejected
from .models import ApiKey, IdempotencyRecord, Instance, OptIn, Project
from .prepared import prepared_cursor

if TYPE_CHECKING:
    from .accept import SendRequest

IDEMPOTENCY_TTL = timedelta(hours=24)

_ERROR_TEXT = {
    "test_recipient_not_allowed": (403, "TEST keys may only send to the project's test number or a TEST magic number."),
    "production_not_approved": (403, "This project is not approved for production sends yet."),
    "unknown_instance": (422, "That instance does not belong to this project."),
    "own_instance_required": (422, "MARKETING messages must go through one of your own instances."),
    "no_instance_available": (422, "No WhatsApp instance is available for this project."),
    "opt_in_required": (422, "The recipient has no live transactional opt-in for this project."),
}


def reject(code: str, **details: Any) -> Rejected:
    status, text = _ERROR_TEXT[code]
    return Rejected(status, code, text, details)


_INSTANCE_COLUMNS = ", ".join(connection.ops.quote_name(f.column) for f in Instance._meta.concrete_fields)
_IDEMPOTENCY_FIELDS = list(IdempotencyRecord._meta.concrete_fields)


def _best(role: str, where: str) -> str:
    return (
        f"(SELECT '{role}' AS role, {_INSTANCE_COLUMNS} FROM {Instance._meta.db_table}"
        f" WHERE {where} ORDER BY {rules.OPEN_FIRST} LIMIT 1)"
    )


def _facts_sql(named: bool, shared: bool) -> str:
    candidates = [_best("own", "project_id = %(project)s" + (" AND name = %(requested)s" if named else ""))]
    if shared:
        candidates += [_best("official", "project_id IS NULL AND is_official"), _best("shared", "project_id IS NULL")]
    record_columns = ", ".join(f"r.{connection.ops.quote_name(f.column)}" for f in _IDEMPOTENCY_FIELDS)
    # key_active: the API key may have been revoked since this process cached it (authentication
    # caches keys for a few seconds); a send checks it here, in the read it makes anyway.
    return f"""
        SELECT f.opted_in, f.key_active, {record_columns}, c.*
        FROM (SELECT EXISTS (SELECT 1 FROM {OptIn._meta.db_table}
                             WHERE project_id = %(project)s AND environment = %(environment)s
                               AND phone = %(to)s AND revoked_at IS NULL)
              AS opted_in,
              (%(api_key)s::bigint IS NULL OR EXISTS (SELECT 1 FROM {ApiKey._meta.db_table}
                                                      WHERE id = %(api_key)s::bigint AND revoked_at IS NULL))
              AS key_active) AS f
        LEFT JOIN {IdempotencyRecord._meta.db_table} AS r
               ON r.project_id = %(project)s AND r.environment = %(environment)s AND r.key = %(key)s
                  AND r.created_at >= %(cutoff)s
        LEFT JOIN ({" UNION ALL ".join(candidates)}) AS c ON true
    """


# (named instance?, shared candidates needed?) → SQL; built once per process.
_FACTS_SQL = {(named, shared): _facts_sql(named, shared) for named in (False, True) for shared in (False, True)}


@dataclass(frozen=True)
class FunnelFacts:
    opted_in: bool
    candidates: rules.InstanceCandidates
    answer: IdempotencyRecord | None = None
    key_active: bool = True


def _read(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def read_facts(
    project: Project, environment: str, req: SendRequest, idempotency_key: str | None, now: datetime,
    api_key: ApiKey | None = None,
) -> FunnelFacts:
    """Whether the API key is still active, the environment's stored answer for the Idempotency-Key and
    opt-in, and the candidate instances: one query."""
    named = bool(req.instance)
    shared = not named and req.category != "MARKETING"
    params: dict[str, Any] = {
        "api_key": api_key.pk if api_key is not None else None,
        "project": project.pk,
        "environment": environment,
        "to": req.to,
        "key": idempotency_key,
        "cutoff": now - IDEMPOTENCY_TTL,
        "requested": req.instance or "",
    }
    # The request's first statement, a read that changes nothing, doubles as its connection health
    # check (one round trip less than CONN_HEALTH_CHECKS' `SELECT 1`; see pilot_status.database).
    rows = checking_connection(lambda: _read(_FACTS_SQL[(named, shared)], params))
    width = len(_IDEMPOTENCY_FIELDS)
    first = rows[0]
    answer = None
    if first[2] is not None:
        answer = writes.load(IdempotencyRecord, first[2 : 2 + width])
    found = {
        row[2 + width]: writes.load(Instance, row[3 + width :]) for row in rows if row[2 + width]
    }
    return FunnelFacts(
        opted_in=bool(first[0]),
        candidates=rules.InstanceCandidates(found.get("own"), found.get("official"), found.get("shared")),
        answer=answer,
        key_active=bool(first[1]),
    )


def judge(project: Project, environment: str, req: SendRequest, facts: FunnelFacts) -> Instance:
    """Environment (403), instance (422), opt-in (422), in the contract's order. Returns the instance."""
    code = rules.check_environment(project, environment, req.to)
    if code:
        raise reject(code, to=req.to)
    instance, code = rules.resolve_instance(req.category, req.instance, facts.opted_in, facts.candidates)
    if code or instance is None:
        raise reject(code or "no_instance_available", instance=req.instance)
    code = rules.check_opt_in(req.category, instance, facts.opted_in)
    if code:
        raise reject(code, to=req.to)
    return instance
