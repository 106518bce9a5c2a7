"""In-memory state: instances, their event settings, stored messages, the sends log, stats."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from . import ids
from .banmodel import ModelClock, Standing
from .config import GlobalConfig
from .faults import Faults

STATES = ("open", "connecting", "close")
DEFAULT_PICTURE = "https://pps.whatsapp.net/v/t61.24694-24/000000000_000000000000000_0000000000000000000_n.jpg"


def iso_now() -> str:
    # Prisma renders Timestamp columns as real UTC ISO strings with milliseconds.
    now = datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


@dataclass(slots=True)
class WebhookRow:
    """The instance's Prisma ``Webhook`` row; ``row_id`` is None until a row exists."""

    enabled: bool = False
    url: str | None = None
    by_events: bool = False
    base64: bool = False
    headers: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)  # UPPER_SNAKE; empty = every event
    row_id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None

    def touch(self) -> None:
        now = iso_now()
        if self.row_id is None:
            self.row_id, self.created_at = ids.cuid(), now
        self.updated_at = now


@dataclass(slots=True)
class RabbitRow:
    enabled: bool = False
    events: list[str] = field(default_factory=list)
    row_id: str | None = None
    created_at: str | None = None
    updated_at: str | None = None

    def touch(self) -> None:
        now = iso_now()
        if self.row_id is None:
            self.row_id, self.created_at = ids.cuid(), now
        self.updated_at = now


@dataclass(slots=True)
class StoredMessage:
    """A Message row: its id, the message as Evolution stored it (the sendText answer for ours) and the
    MessageUpdate rows attached to it."""

    row_id: str
    seq: int
    response: dict[str, Any]
    updates: list[dict[str, Any]] = field(default_factory=list)
    # Evolution's MessageUpdate.keyId is VARCHAR(100): a longer id gets its events but no rows.
    keeps_updates: bool = True


@dataclass(slots=True)
class Instance:
    name: str
    id: str = field(default_factory=ids.instance_uuid)
    token: str = field(default_factory=ids.instance_token)
    state: str = "open"
    deleted: bool = False
    loaded: bool = True
    owner_jid: str = ""
    profile_name: str | None = None  # defaults to the instance name
    profile_picture_url: str | None = DEFAULT_PICTURE
    integration: str = "WHATSAPP-BAILEYS"
    # Evolution omits `sender` until the instance has been open once in this process.
    has_been_open: bool = True
    created_at: str = field(default_factory=iso_now)
    updated_at: str = field(default_factory=iso_now)
    created_epoch: int = field(default_factory=lambda: int(time.time()))
    webhook: WebhookRow = field(default_factory=WebhookRow)
    rabbitmq: RabbitRow = field(default_factory=RabbitRow)
    faults: Faults = field(default_factory=Faults)
    # Contacts WhatsApp addresses by LID (phone digits → `…@lid`): their chats and messages are
    # stored under the LID jid, as Evolution 2.3.7 does, with the phone jid as `remoteJidAlt`.
    lids: dict[str, str] = field(default_factory=dict)
    # Message rows by row id, oldest first; by WhatsApp key id too. Evolution has no unique index on the
    # key id: a reused messageId makes a second row, and a look-up by key id finds both.
    messages: OrderedDict[str, StoredMessage] = field(default_factory=OrderedDict)
    by_key_id: dict[str, list[StoredMessage]] = field(default_factory=dict)
    # An Evolution older than `messageId` (an unknown field then): every send gets an id Baileys makes.
    ignore_message_id: bool = False
    # This number's overrides of the global ban model, and what the model holds against it.
    ban_model: dict[str, Any] = field(default_factory=dict)
    standing: Standing = field(default_factory=Standing)
    # Contacts the number exchanged a message with (phone digits, or a LID nobody mapped): not cold.
    warm: set[str] = field(default_factory=set)
    in_flight: int = 0  # sendText calls on this number being answered now, and the most at once
    max_in_flight: int = 0
    # Evolution's injected 1:1 contextInfo; identical for every message, so shared (memory).
    context_info: dict[str, Any] = field(default_factory=dict)
    send_total: int = 0
    send_by_status: dict[str, int] = field(default_factory=dict)
    events_emitted: int = 0

    def __post_init__(self) -> None:
        if not self.owner_jid:
            self.owner_jid = ids.default_owner_jid(self.name)
        if self.profile_name is None:
            self.profile_name = self.name
        self.context_info = {
            "mentionedJid": [],
            "groupMentions": [],
            "statusAttributions": [],
            "ephemeralSettingTimestamp": {"low": self.created_epoch, "high": 0, "unsigned": False},
            "disappearingMode": {"initiator": 0},
        }

    @property
    def sender(self) -> str | None:
        return self.owner_jid if self.has_been_open else None

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.id,
            "token": self.token,
            "state": self.state,
            "deleted": self.deleted,
            "loaded": self.loaded,
            "owner_jid": self.owner_jid,
            "profile_name": self.profile_name,
            "profile_picture_url": self.profile_picture_url,
            "integration": self.integration,
            "webhook": {
                "enabled": self.webhook.enabled,
                "url": self.webhook.url,
                "byEvents": self.webhook.by_events,
                "base64": self.webhook.base64,
                "headers": self.webhook.headers,
                "events": self.webhook.events,
            },
            "rabbitmq": {"enabled": self.rabbitmq.enabled, "events": self.rabbitmq.events},
            "faults": self.faults.to_dict(),
            "lids": dict(self.lids),
            "ignore_message_id": self.ignore_message_id,
            "ban_model": dict(self.ban_model),
            "created_at": self.created_at,
        }

    def counters(self) -> dict[str, Any]:
        return {
            "send_text": self.send_total,
            "by_status": dict(self.send_by_status),
            "events_emitted": self.events_emitted,
            "stored_messages": len(self.messages),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
        }

    def contact(self, jid: str) -> str:
        """Who a jid is, for warmth: the phone digits (a LID mapped back to its phone when known)."""
        user, _, server = jid.partition("@")
        if server == "lid":
            for phone, lid in self.lids.items():
                if lid == jid:
                    return phone
            return jid
        return user.split(":")[0]

    def indexed(self, key_id: Any) -> list[StoredMessage]:
        return self.by_key_id.get(key_id, []) if isinstance(key_id, str) else []


@dataclass(slots=True)
class Stats:
    started: float = field(default_factory=time.monotonic)
    send_total: int = 0
    send_by_status: dict[str, int] = field(default_factory=dict)
    # sendText calls being answered right now, and the most there ever were at once: how much
    # concurrency a slow gateway really saw from the workers (issue 26), counted where it happens.
    send_in_flight: int = 0
    send_in_flight_max: int = 0
    # GlobalConfig.service_ms: requests waiting for the gateway's CPU now, and for each request served how
    # many were waiting when it arrived (queue length -> requests): what a caller's OTP would queue behind.
    queue_waiting: int = 0
    queue_on_arrival: dict[int, int] = field(default_factory=dict)
    wh_posted: int = 0
    wh_ok: int = 0
    wh_failed: int = 0
    wh_dropped: int = 0
    wh_duplicated: int = 0
    wh_retried: int = 0
    rmq_published: int = 0
    rmq_dropped: int = 0
    rmq_duplicated: int = 0
    rmq_failed: int = 0

    def send_started(self) -> None:
        self.send_in_flight += 1
        self.send_in_flight_max = max(self.send_in_flight_max, self.send_in_flight)

    def queue_arrived(self) -> None:
        self.queue_on_arrival[self.queue_waiting] = self.queue_on_arrival.get(self.queue_waiting, 0) + 1
        self.queue_waiting += 1

    def queue_left(self) -> None:
        self.queue_waiting = max(0, self.queue_waiting - 1)

    def send_finished(self) -> None:
        self.send_in_flight = max(0, self.send_in_flight - 1)

    def count_send(self, status: int) -> None:
        self.send_total += 1
        key = str(status)
        self.send_by_status[key] = self.send_by_status.get(key, 0) + 1


class World:
    """Everything the handlers share. One per process; reset by /_control/reset."""

    def __init__(self, cfg: GlobalConfig) -> None:
        self.cfg = cfg
        self.startup_cfg = cfg.copy()
        self.instances: dict[str, Instance] = {}
        self.sends: deque[dict[str, Any]] = deque(maxlen=cfg.max_stored_messages)
        # Insertion order of stored messages across instances, to forget the oldest first.
        self.message_order: deque[tuple[Instance, str]] = deque()
        self.stats = Stats()
        self.clock = ModelClock(cfg.time_scale)  # the ban model's time
        # Bumped by reset so timers scheduled before it (receipts, pairing) become no-ops.
        self.generation = 0
        self._seq = 0

    def live(self, name: str) -> Instance | None:
        inst = self.instances.get(name)
        return None if inst is None or inst.deleted else inst

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def store_message(self, inst: Instance, msg: StoredMessage) -> None:
        inst.messages[msg.row_id] = msg
        key_id = msg.response["key"]["id"]
        if isinstance(key_id, str):  # a non-string id is stored, but no look-up by a string finds it
            inst.by_key_id.setdefault(key_id, []).append(msg)
        self.message_order.append((inst, msg.row_id))
        # Bound memory during long benchmarks: forget the oldest messages first.
        while len(self.message_order) > self.cfg.max_stored_messages:
            old_inst, old_row = self.message_order.popleft()
            old = old_inst.messages.pop(old_row, None)
            if old is not None:
                self._unindex(old_inst, old)

    @staticmethod
    def _unindex(inst: Instance, msg: StoredMessage) -> None:
        key_id = msg.response["key"]["id"]
        same = inst.by_key_id.get(key_id) if isinstance(key_id, str) else None
        if same is None:
            return
        if same[0] is msg:  # the oldest goes first: almost always the head
            same.pop(0)
        elif msg in same:
            same.remove(msg)
        if not same:
            del inst.by_key_id[key_id]

    def reset(self, include_global: bool) -> None:
        self.generation += 1
        self.instances.clear()
        self.stats = Stats()
        if include_global:
            # Mutate in place: the emitter and publishers hold this same object.
            for key, value in vars(self.startup_cfg.copy()).items():
                setattr(self.cfg, key, value)
        self.sends = deque(maxlen=self.cfg.max_stored_messages)
        self.message_order.clear()
        if self.clock.scale != self.cfg.time_scale:
            self.clock.set_scale(self.cfg.time_scale)
