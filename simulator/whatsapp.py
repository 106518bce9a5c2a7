"""The fake WhatsApp side: numbers that exist, messages that get receipts, connection state.

Receipts are chained timers (``loop.call_later``), not tasks: no per-message coroutine, and a
reset invalidates them through ``World.generation``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from . import ids
from .events import Emitter
from .state import Instance, StoredMessage, World

PUSH_NAME = "Você"  # Evolution's default pushName for messages we send


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
    def send_text(self, inst: Instance, jid: str, text: str) -> StoredMessage:
        now = int(time.time())
        lid = inst.lids.get(jid.split("@", 1)[0])
        key = {"remoteJid": lid, "fromMe": True, "id": ids.message_id(), "remoteJidAlt": jid} if lid else {
            "remoteJid": jid, "fromMe": True, "id": ids.message_id()}
        response: dict[str, Any] = {
            "key": key,
            "pushName": PUSH_NAME,
            "status": "PENDING",
            "message": {"conversation": text},
            "contextInfo": inst.context_info,  # opaque in the spec
            "messageType": "conversation",
            "messageTimestamp": now,
            "instanceId": inst.id,
            "source": "web",
        }
        msg = StoredMessage(row_id=ids.cuid(), seq=self.world.next_seq(), response=response)
        self.world.store_message(inst, msg)
        self.emitter.emit_soon(inst, "send.message", response)
        self._schedule_receipts(inst, msg)
        return msg

    def _receipt_plan(self, inst: Instance) -> list[tuple[str, float]]:
        delays = dict(self.world.cfg.ack_delays_ms)
        delays.update(inst.faults.ack_delays_ms)
        return [(status, float(ms)) for status, ms in delays.items() if ms is not None]

    def _schedule_receipts(self, inst: Instance, msg: StoredMessage) -> None:
        plan = self._receipt_plan(inst)
        if plan:
            loop = asyncio.get_running_loop()
            loop.call_later(plan[0][1] / 1000, self._receipt, self.world.generation, inst, msg, plan, 0)

    def _receipt(self, generation: int, inst: Instance, msg: StoredMessage,
                 plan: list[tuple[str, float]], step: int) -> None:
        if generation != self.world.generation or inst.deleted:
            return
        status = plan[step][0]
        key = msg.response["key"]
        # The MessageUpdate row (findStatusMessage) has participant/pollUpdates as DB nulls ...
        msg.updates.append({
            "id": ids.cuid(),
            "keyId": key["id"],
            "remoteJid": key["remoteJid"],
            "fromMe": True,
            "participant": None,
            "pollUpdates": None,
            "status": status,
            "messageId": msg.row_id,
            "instanceId": inst.id,
        })
        # ... while the event omits them (undefined in JavaScript).
        self.emitter.emit(inst, "messages.update", {
            "keyId": key["id"],
            "remoteJid": key["remoteJid"],
            "fromMe": True,
            "status": status,
            "instanceId": inst.id,
            "messageId": msg.row_id,
        })
        if step + 1 < len(plan):
            asyncio.get_running_loop().call_later(
                plan[step + 1][1] / 1000, self._receipt, generation, inst, msg, plan, step + 1)

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
        self.set_state(inst, "connecting")
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
