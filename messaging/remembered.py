"""What a process remembers of the accept funnel's facts, and the guard that re-checks them.

Most accepts repeat what an earlier one of the same project found: the key active, the recipient
opted in, the same best instances. A process remembers the candidate instances its last funnel
read found (per project, named instance and group); messaging.accept judges the next request on
them and writes with a guard that re-checks, inside the one statement, every fact the judgement
rested on: the key unrevoked, the opt-in (or its absence) when the choice depends on it, and the
best instance of each group the choice read still the same one (id, open or not, official or not,
name). When the guard fails (a fact changed, or the bet on the opt-in was wrong) nothing is
written and the request takes the read-then-write path, which decides on fresh facts and
remembers them. Any refusal is decided there too. tests/messaging/test_accept_fast_path.py
changes each fact behind a remembered choice and holds every answer to the one fresh facts give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import rules
from .models import ApiKey, ConnectionState, Instance, OptIn, Project

if TYPE_CHECKING:
    from .accept import SendRequest
    from .funnel import FunnelFacts

SEEN_LIMIT = 4096
_seen: dict[tuple[int, str, bool], rules.InstanceCandidates] = {}
_last_opted_in: dict[tuple[int, str, str], bool] = {}  # (project, environment, category) → the last read's opt-in


def _candidates_key(project: Project, req: SendRequest) -> tuple[int, str, bool]:
    return project.pk, req.instance or "", not req.instance and req.category != "MARKETING"


def candidates_seen(project: Project, req: SendRequest) -> rules.InstanceCandidates | None:
    """The candidates this process's last read found for such a request, if any."""
    return _seen.get(_candidates_key(project, req))


def remember(project: Project, environment: str, req: SendRequest, facts: FunnelFacts) -> None:
    if req.instance and facts.candidates.own is None:
        # A name that is not the project's is refused, and a refusal is always decided on fresh
        # facts: remembering it would only let a client fill this process's memory with names.
        return
    if len(_seen) >= SEEN_LIMIT:
        _seen.clear()
        _last_opted_in.clear()
    _seen[_candidates_key(project, req)] = facts.candidates
    _last_opted_in[(project.pk, environment, req.category)] = facts.opted_in


class _Reading(rules.InstanceCandidates):
    """These candidates, noting which groups a judgement reads: the guard re-checks only those (a
    project whose own instance is open does not fall back because a shared one changed)."""

    def __getattribute__(self, name: str) -> Any:
        if name in _GROUPS:
            super().__getattribute__("__dict__").setdefault("groups_read", set()).add(name)
        return super().__getattribute__(name)

    @classmethod
    def of(cls, seen: rules.InstanceCandidates) -> _Reading:
        return cls(seen.own, seen.official, seen.shared)

    def read(self) -> set[str]:
        return set(self.__dict__.get("groups_read", ()))


_GROUPS = ("own", "official", "shared")


@dataclass(frozen=True)
class Plan:
    instance: Instance
    opt_in: bool | None  # the opt-in the choice rests on: True, False, or None when it is the same either way
    groups: set[str]  # the candidate groups the choice rests on


def plan(project: Project, environment: str, req: SendRequest, seen: rules.InstanceCandidates) -> Plan | None:
    """The choice judge() makes on these candidates, and the facts it rests on; None when that
    judgement refuses (a refusal is always decided on fresh facts).

    When the choice differs with the opt-in (an OTP goes through the official number without one),
    it bets on what the last two-statement accept of this project and category found."""
    if rules.check_environment(project, environment, req.to):
        return None
    reading_with, reading_without = _Reading.of(seen), _Reading.of(seen)
    with_opt_in, code = rules.resolve_instance(req.category, req.instance, True, reading_with)
    if code or with_opt_in is None:
        return None
    without, code = rules.resolve_instance(req.category, req.instance, False, reading_without)
    if code or without is None or rules.check_opt_in(req.category, without, False):
        return Plan(with_opt_in, True, reading_with.read())
    if without.pk == with_opt_in.pk:
        return Plan(with_opt_in, None, reading_with.read() | reading_without.read())
    if _last_opted_in.get((project.pk, environment, req.category), True):
        return Plan(with_opt_in, True, reading_with.read())
    return Plan(without, False, reading_without.read())


_INSTANCE_TABLE = Instance._meta.db_table
_OPEN = ConnectionState.OPEN.value


def _group_guard(where: str, seen: Instance | None) -> str:
    if seen is None:
        return f"NOT EXISTS (SELECT 1 FROM {_INSTANCE_TABLE} WHERE {where})"
    # One array parameter per group: with one per fact the statement passed psycopg's 50-parameter
    # limit for caching its parsed form.
    return (
        f"COALESCE((SELECT ARRAY[id::text, (connection_state = '{_OPEN}')::text, is_official::text, name::text]"
        f" = %s::text[] FROM {_INSTANCE_TABLE} WHERE {where} ORDER BY {rules.OPEN_FIRST} LIMIT 1), false)"
    )


def _fingerprint(instance: Instance) -> list[str]:
    """What _group_guard compares, as Postgres writes it."""
    return [str(instance.pk), _bool_text(instance.connection_state == _OPEN), _bool_text(instance.is_official),
            instance.name]


def _bool_text(value: bool) -> str:
    return "true" if value else "false"


def guard(
    project: Project, environment: str, api_key: ApiKey | None, req: SendRequest, seen: rules.InstanceCandidates,
    plan: Plan,
) -> tuple[str, list[Any]]:
    """The SQL condition (and its parameters) that holds while every fact the plan rests on still does."""
    opt_in = plan.opt_in
    conditions: list[str] = []
    params: list[Any] = []
    if api_key is not None:
        conditions.append(f"EXISTS (SELECT 1 FROM {ApiKey._meta.db_table} WHERE id = %s AND revoked_at IS NULL)")
        params.append(api_key.pk)
    if opt_in is not None:
        conditions.append(
            ("" if opt_in else "NOT ") + f"EXISTS (SELECT 1 FROM {OptIn._meta.db_table}"
            " WHERE project_id = %s AND environment = %s AND phone = %s AND revoked_at IS NULL)"
        )
        params += [project.pk, environment, req.to]
    groups: dict[str, tuple[str, list[Any], Instance | None]] = {
        "own": ("project_id = %s AND name = %s", [project.pk, req.instance], seen.own) if req.instance
        else ("project_id = %s", [project.pk], seen.own),
        "official": ("project_id IS NULL AND is_official", [], seen.official),
        "shared": ("project_id IS NULL", [], seen.shared),
    }
    for where, where_params, instance in (groups[name] for name in _GROUPS if name in plan.groups):
        conditions.append(_group_guard(where, instance))
        if instance is not None:
            params.append(_fingerprint(instance))
        params += where_params
    return " AND ".join(conditions) or "true", params
