"""The messaging domain: tenants, keys, instances, messages, their timeline, the outbox, dead letters.

A message's status changes only through messaging.lifecycle: compare-and-set UPDATEs that only move
forward (docs/architecture.md, principle 3), each with its MessageEvent, so that the timeline is the audit trail.

The models live in tenants (projects, keys, instances, opt-ins, contacts), message (a message and its
records, the sending schedule) and instance_health (a number's signals and health changes). The rest of the code
imports them, and the vocabularies, from here (`X as X`: an explicit re-export).
"""

from __future__ import annotations

from ..choices import (
    STATUS_LINE_KINDS as STATUS_LINE_KINDS,
    Category as Category,
    ConnectionState as ConnectionState,
    DeadLetterStatus as DeadLetterStatus,
    Environment as Environment,
    EventKind as EventKind,
    FailureReason as FailureReason,
    HealthState as HealthState,
    Priority as Priority,
    SendProfile as SendProfile,
    SignalKind as SignalKind,
    Status as Status,
    Typing as Typing,
)

# The migrations name the fields' defaults by this path: messaging.models.new_token_salt (0007) and
# messaging.models.default_opt_out_keywords (0012).
from ..tokens import new_token_salt as new_token_salt
from .instance_health import (
    InstanceHealthEvent as InstanceHealthEvent,
    InstanceSignal as InstanceSignal,
)
from .message import (
    DeadLetter as DeadLetter,
    IdempotencyRecord as IdempotencyRecord,
    Message as Message,
    MessageEvent as MessageEvent,
    OutboxEntry as OutboxEntry,
    SendSchedule as SendSchedule,
)
from .tenants import (
    DEFAULT_OPT_OUT_KEYWORDS as DEFAULT_OPT_OUT_KEYWORDS,
    MAX_OPT_OUT_KEYWORD_LENGTH as MAX_OPT_OUT_KEYWORD_LENGTH,
    MAX_OPT_OUT_KEYWORDS as MAX_OPT_OUT_KEYWORDS,
    ApiKey as ApiKey,
    Contact as Contact,
    Instance as Instance,
    OptIn as OptIn,
    Project as Project,
    default_opt_out_keywords as default_opt_out_keywords,
)
