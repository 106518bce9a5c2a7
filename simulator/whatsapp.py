"""The fake WhatsApp side: numbers that exist, messages that get receipts, connection state.

Receipts are chained timers (``loop.call_later``), not tasks: no per-message coroutine, and a
reset invalidates them through ``World.generation``. The ban model (simulator/banmodel.py) judges each
send here, when it reaches WhatsApp, and its verdicts become WhatsApp's answers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, NamedTuple

from . import banmodel, ids
from .events import Emitter
from .faults import roll
from .state import Instance, StoredMessage, World

PUSH_NAME = "Você"  # Evolution's default pushName for messages we send
KEY_ID_COLUMN = 100  # MessageUpdate.keyId is VARCHAR(100) in Evolution's Prisma schema


class Sent(NamedTuple):
    msg: StoredMessage
    outcome: str  # "accepted" (receipts follow), "463" (a strike of the ban model), "unacknowledged"
    id_reused: str | None  # the messageId was used before on this number: "same_chat" or "other_chat"


def _reuse(earlier: list[StoredMessage], remote_jid: str) -> str | None:
    """WhatsApp scopes a message id to its chat: the same id again in that chat is a repeat the recipient's
    WhatsApp shows once; in another chat it is another message (and Evolution mixes their receipts)."""
    if not earlier:
        return None
    return "same_chat" if any(m.response["key"]["remoteJid"] == remote_jid for m in earlier) else "other_chat"


class WhatsApp:
    def __init__(self, world: World, emitter: Emitter) -> None:
        self.world = world
        self.emitter = emitter

    # -- numbers -----------------------------------------------------------------------
    @staticmethod
    def lid_of(inst: Instance, jid: str) -> str | None:
        return inst.lids.get(jid.split("@", 1)[0])

    @staticmethod
    def lookup(inst: Instance, raw_number: str) -> tuple[str, bool]:
        jid = ids.create_jid(raw_number)
        if jid.startswith("@"):
            return jid, False  # no digits at all: WhatsApp knows no such user
        absent = inst.faults.absent
        if absent and not ids.is_group(jid):
            # Match the number as typed (digits only) and as the jid WhatsApp would use.
            if ids.digits_of(raw_number) in absent or jid.split("@", 1)[0] in absent:
                return jid, False
        return jid, True

    # -- sending -----------------------------------------------------------------------
    def send_text(self, inst: Instance, jid: str, text: str, message_id: Any = None) -> Sent:
        """The message reaches WhatsApp: store it, emit send.message, then its receipts, or the ban model's
        463, or nothing at all (never acknowledged)."""
        now = int(time.time())
        # Evolution passes `messageId` on when it is truthy (`if (messageId)`), and Baileys uses it as is.
        honoured = not inst.ignore_message_id and ids.js_truthy(message_id)
        key_id = message_id if honoured else ids.message_id()
        lid = inst.lids.get(jid.split("@", 1)[0])
        key = {"remoteJid": lid, "fromMe": True, "id": key_id, "remoteJidAlt": jid} if lid else {
            "remoteJid": jid, "fromMe": True, "id": key_id}
        reused = _reuse(inst.indexed(key_id), lid or jid) if honoured else None
        response: dict[str, Any] = {
            "key": key,
            "pushName": PUSH_NAME,
            "status": "PENDING",
            "message": {"conversation": text},
            "contextInfo": inst.context_info,  # opaque: Evolution's own, not read
            "messageType": "conversation",
            "messageTimestamp": now,
            "instanceId": inst.id,
            # prepareMessage: getDevice(key.id), so an id of another format passes for another device.
            "source": ids.device_of(key_id) if honoured else "web",
        }
        msg = StoredMessage(row_id=ids.cuid(), seq=self.world.next_seq(), response=response,
                            keeps_updates=not isinstance(key_id, str) or len(key_id) <= KEY_ID_COLUMN)
        self.world.store_message(inst, msg)
        self.emitter.emit_soon(inst, "send.message", response)
        contact = inst.contact(jid)
        params = self.model_params(inst)
        if params is not None:
            broken = self._judge(inst, params, contact)
            if broken:
                self._refuse(inst, params, msg, broken, contact)
                return Sent(msg, "463", reused)
        if not isinstance(key_id, str) or roll(inst.faults.never_ack_rate):
            # A stanza Baileys cannot encode (a non-string id), or WhatsApp's known silence (evolution-api
            # #1938, #2597): 201 PENDING, then nothing, while the instance stays connected.
            return Sent(msg, "unacknowledged", reused)
        inst.warm.add(contact)
        self._schedule_receipts(inst, msg, self._receipt_plan(inst))
        return Sent(msg, "accepted", reused)

    def _receipt_plan(self, inst: Instance) -> list[tuple[str, float]]:
        delays = dict(self.world.cfg.ack_delays_ms)
        delays.update(inst.faults.ack_delays_ms)
        return [(status, float(ms)) for status, ms in delays.items() if ms is not None]

    def _schedule_receipts(self, inst: Instance, msg: StoredMessage, plan: list[tuple[str, float]]) -> None:
        if plan:
            loop = asyncio.get_running_loop()
            loop.call_later(plan[0][1] / 1000, self._receipt, self.world.generation, inst, msg, plan, 0)

    def _receipt(self, generation: int, inst: Instance, msg: StoredMessage,
                 plan: list[tuple[str, float]], step: int) -> None:
        if generation != self.world.generation or inst.deleted:
            return
        status = plan[step][0]
        key = msg.response["key"]
        # Evolution files a receipt under the first Message row with that key id (no chat in the query,
        # LIMIT 1) and reports that row's chat: a reused id's receipts land on the first message.
        same = inst.indexed(key["id"])
        row = same[0] if same else msg
        remote_jid = row.response["key"]["remoteJid"]
        if row.keeps_updates:
            # The MessageUpdate row (findStatusMessage) has participant/pollUpdates as DB nulls ...
            row.updates.append({
                "id": ids.cuid(),
                "keyId": key["id"],
                "remoteJid": remote_jid,
                "fromMe": key["fromMe"],
                "participant": None,
                "pollUpdates": None,
                "status": status,
                "messageId": row.row_id,
                "instanceId": inst.id,
            })
        # ... while the event omits them (undefined in JavaScript).
        self.emitter.emit(inst, "messages.update", {
            "keyId": key["id"],
            "remoteJid": remote_jid,
            "fromMe": key["fromMe"],
            "status": status,
            "instanceId": inst.id,
            "messageId": row.row_id,
        })
        if step + 1 < len(plan):
            asyncio.get_running_loop().call_later(
                plan[step + 1][1] / 1000, self._receipt, generation, inst, msg, plan, step + 1)

    # -- the ban model -----------------------------------------------------------------
    def model_params(self, inst: Instance) -> dict[str, Any] | None:
        """The ban model's settings for this number, or None while the model is off for it. Turned on
        globally, it covers Baileys numbers only (a Cloud API number has Meta's limits, not modelled)."""
        cfg = self.world.cfg.ban_model
        enabled = inst.ban_model.get("enabled")
        if enabled is None:
            enabled = cfg["enabled"] and inst.integration == "WHATSAPP-BAILEYS"
        if not enabled:
            return None
        return {**cfg, **inst.ban_model} if inst.ban_model else cfg

    def _judge(self, inst: Instance, params: dict[str, Any], contact: str) -> list[dict[str, Any]]:
        standing = inst.standing
        if standing.banned:
            return [{"rule": "banned"}]  # not reached while the instance stays closed
        return banmodel.judge(standing, params, self.world.clock.now(), inst.in_flight, contact not in inst.warm)

    def _refuse(self, inst: Instance, params: dict[str, Any], msg: StoredMessage, broken: list[dict[str, Any]],
                contact: str) -> None:
        """A strike: WhatsApp nacks the message with 463 (Evolution: messages.update ERROR, the code only in
        its log), then maybe closes the session or bans the number, in that order on the wire."""
        loop = asyncio.get_running_loop()
        loop.call_soon(self._receipt, self.world.generation, inst, msg, [("ERROR", 0.0)], 0)
        verdict = banmodel.strike(inst.standing, params, self.world.clock.now(), broken, contact)
        if verdict == "ban":
            self.set_state(inst, "close", 403)  # Baileys' forbidden: Evolution does not reconnect
        elif verdict == "disconnect":
            self.set_state(inst, "close", 401)  # logged out: the linked device was removed
            self._schedule_pairing_again(inst)

    def _schedule_pairing_again(self, inst: Instance) -> None:
        until = inst.standing.disconnected_until
        if until is None:
            return
        clock = self.world.clock
        # Looked at again at least twice a second, so that a new time scale applies to a pause under way.
        wait = min(clock.real_delay(max(0.0, until - clock.now())), 0.5)
        asyncio.get_running_loop().call_later(wait, self._pair_again, self.world.generation, inst)

    def _pair_again(self, generation: int, inst: Instance) -> None:
        standing = inst.standing
        if (generation != self.world.generation or inst.deleted or standing.banned or not standing.disconnected
                or standing.disconnected_until is None):
            return
        now = self.world.clock.now()
        if now < standing.disconnected_until - 1e-6:
            self._schedule_pairing_again(inst)
            return
        standing.disconnected, standing.disconnected_until = False, None
        standing.note("reconnect", now)
        if inst.state == "close":  # the owner scans a QR code again: as for a new instance
            self._pair(inst)

    def standing(self, inst: Instance) -> dict[str, Any]:
        params = self.model_params(inst)
        enabled = params is not None
        if params is None:
            params = {**self.world.cfg.ban_model, **inst.ban_model}
        return {**banmodel.report(inst.standing, params, self.world.clock.now(), enabled),
                "warm_contacts": len(inst.warm), "in_flight": inst.in_flight, "max_in_flight": inst.max_in_flight}

    # -- messages WhatsApp relays from elsewhere ------------------------------------------
    def note_exchange(self, inst: Instance, data: Any) -> None:
        """An emitted messages.upsert (a contact wrote, or the phone did): that chat is no longer cold."""
        key = data.get("key") if isinstance(data, dict) else None
        if not isinstance(key, dict):
            return
        for field in ("remoteJid", "remoteJidAlt"):
            jid = key.get(field)
            if isinstance(jid, str) and "@" in jid and not jid.endswith(("@g.us", "@broadcast", "@newsletter")):
                inst.warm.add(inst.contact(jid))

    def relayed_message(self, inst: Instance, jid: str, text: str, *, from_me: bool, device: str, at: int,
                        key_id: str, push_name: str) -> StoredMessage:
        """A message WhatsApp relays to Evolution: typed on the account's phone (or on another device or
        integration linked to it), or written by the contact. Evolution gets it as messages.upsert, never
        as send.message (that is only for its own sendText), and stores it like any other."""
        lid = inst.lids.get(jid.split("@", 1)[0])
        stored_key = {"remoteJid": lid, "fromMe": from_me, "id": key_id, "remoteJidAlt": jid} if lid else {
            "remoteJid": jid, "fromMe": from_me, "id": key_id}
        # Baileys marks a message from the account's own device SERVER_ACK; Evolution stores a contact's
        # without a status as DELIVERY_ACK.
        status = "SERVER_ACK" if from_me else "DELIVERY_ACK"
        record: dict[str, Any] = {"key": stored_key, "pushName": push_name, "status": status,
                                  "message": {"conversation": text}, "contextInfo": None,
                                  "messageType": "conversation", "messageTimestamp": at, "instanceId": inst.id,
                                  "source": device}
        msg = StoredMessage(row_id=ids.cuid(), seq=self.world.next_seq(), response=record)
        self.world.store_message(inst, msg)
        # The event is built after the row is written: for a LID chat Evolution swaps the jids in it.
        event_key: dict[str, Any] = {"remoteJid": jid, "fromMe": from_me, "id": key_id, "remoteJidAlt": lid,
                                     "addressingMode": "pn"} if lid else dict(stored_key)
        self.emitter.emit_soon(inst, "messages.upsert", {
            "key": event_key, "pushName": push_name, "status": status, "message": {"conversation": text},
            "messageType": "conversation", "messageTimestamp": at, "instanceId": inst.id, "source": device})
        inst.warm.add(inst.contact(jid))
        if from_me:  # the contact's receipts reach every device of the account; the server's ack does not
            plan = [(s, ms) for s, ms in self._receipt_plan(inst) if s != "SERVER_ACK"]
            self._schedule_receipts(inst, msg, plan)
        return msg

    # -- connection --------------------------------------------------------------------
    def set_state(self, inst: Instance, state: str, status_reason: int | None = None) -> None:
        """Change the connection state and emit connection.update like Baileys' handler."""
        if state == inst.state:
            return
        inst.state = state
        if state == "open":
            inst.has_been_open = True
            data: dict[str, Any] = {
                "instance": inst.name,
                "wuid": inst.owner_jid,
                "profileName": inst.profile_name,
                "profilePictureUrl": inst.profile_picture_url,
                "state": "open",
                "statusReason": status_reason or 200,
            }
        elif state == "connecting":
            data = {"instance": inst.name, "state": "connecting", "statusReason": status_reason or 200}
        else:
            # Evolution reports close only when it will not reconnect (e.g. 401 logged out).
            data = {"instance": inst.name, "state": "close", "statusReason": status_reason or 401}
        self.emitter.emit_soon(inst, "connection.update", data)

    def start_pairing(self, inst: Instance) -> None:
        """Instance created with qrcode: connecting now, open after ``auto_pair_ms`` (a QR scan)."""
        self._pair(inst, announce_qr=True)

    def _pair(self, inst: Instance, announce_qr: bool = False) -> None:
        self.set_state(inst, "connecting")
        if announce_qr:
            self.emitter.emit_soon(inst, "qrcode.updated", {"qrcode": qr_code(inst)})
        delay = self.world.cfg.auto_pair_ms
        if delay is not None:
            generation = self.world.generation

            def pair() -> None:
                if generation == self.world.generation and not inst.deleted and inst.state == "connecting":
                    self.set_state(inst, "open")

            asyncio.get_running_loop().call_later(delay / 1000, pair)


def qr_code(inst: Instance) -> dict[str, Any]:
    return {
        "instance": inst.name,
        "pairingCode": None,
        "code": f"2@{ids.message_id()}{ids.message_id()},simulated,{inst.id}",
        "base64": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
    }
