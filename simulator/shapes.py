"""Response bodies shaped like Evolution's Prisma rows and controller results (key order kept)."""

from __future__ import annotations

from typing import Any

from .state import Instance, StoredMessage

CLIENT_NAME = "evolution_exchange"  # DATABASE_CONNECTION_CLIENT_NAME default


def webhook_row(inst: Instance) -> dict[str, Any] | None:
    hook = inst.webhook
    if hook.row_id is None:
        return None
    return {
        "id": hook.row_id,
        "url": hook.url,
        "headers": hook.headers,
        "enabled": hook.enabled,
        "events": hook.events,
        "webhookByEvents": hook.by_events,
        "webhookBase64": hook.base64,
        "createdAt": hook.created_at,
        "updatedAt": hook.updated_at,
        "instanceId": inst.id,
    }


def rabbitmq_row(inst: Instance) -> dict[str, Any] | None:
    row = inst.rabbitmq
    if row.row_id is None:
        return None
    return {
        "id": row.row_id,
        "enabled": row.enabled,
        "events": row.events,
        "createdAt": row.created_at,
        "updatedAt": row.updated_at,
        "instanceId": inst.id,
    }


def setting_row(inst: Instance) -> dict[str, Any]:
    return {
        "id": "c" + inst.id.replace("-", "")[:24],  # stable per instance
        "rejectCall": False,
        "msgCall": "",
        "groupsIgnore": False,
        "alwaysOnline": False,
        "readMessages": False,
        "readStatus": False,
        "syncFullHistory": False,
        "wavoipToken": "",
        "createdAt": inst.created_at,
        "updatedAt": inst.created_at,
        "instanceId": inst.id,
    }


def instance_info(inst: Instance) -> dict[str, Any]:
    """One row of GET /instance/fetchInstances (monitor.service.ts instanceInfo)."""
    chats = {m.response["key"]["remoteJid"] for m in inst.messages.values()}
    return {
        "id": inst.id,
        "name": inst.name,
        "connectionStatus": inst.state,
        "ownerJid": inst.owner_jid if inst.has_been_open else None,
        "profileName": inst.profile_name,
        "profilePicUrl": inst.profile_picture_url,
        "integration": inst.integration,
        "number": None,
        "businessId": None,
        "token": inst.token,
        "clientName": CLIENT_NAME,
        "disconnectionReasonCode": None,
        "disconnectionObject": None,
        "disconnectionAt": None,
        "createdAt": inst.created_at,
        "updatedAt": inst.updated_at,
        "Chatwoot": None,
        "Proxy": None,
        "Rabbitmq": rabbitmq_row(inst),
        "Nats": None,
        "Sqs": None,
        "Websocket": None,
        "Setting": setting_row(inst),
        "_count": {"Message": len(inst.messages), "Contact": len(chats), "Chat": len(chats)},
    }


def create_result(inst: Instance, body: dict[str, Any], qrcode: dict[str, Any] | None) -> dict[str, Any]:
    """POST /instance/create 201 body; keys that are undefined in JavaScript are omitted."""
    hook_in: dict[str, Any] = body["webhook"] if isinstance(body.get("webhook"), dict) else {}
    rmq_in: dict[str, Any] = body["rabbitmq"] if isinstance(body.get("rabbitmq"), dict) else {}
    webhook = {k: v for k, v in (("webhookUrl", hook_in.get("url")), ("webhookHeaders", hook_in.get("headers")),
                                 ("webhookByEvents", hook_in.get("byEvents")),
                                 ("webhookBase64", hook_in.get("base64"))) if v is not None}
    result: dict[str, Any] = {
        "instance": {
            "instanceName": inst.name,
            "instanceId": inst.id,
            "integration": inst.integration,
            "webhookWaBusiness": None,
            "accessTokenWaBusiness": "",
            "status": inst.state,
        },
        "hash": inst.token,
        "webhook": webhook,
        "websocket": {},
        "rabbitmq": {"enabled": rmq_in["enabled"]} if "enabled" in rmq_in else {},
        "nats": {},
        "sqs": {},
        "settings": {
            "rejectCall": body.get("rejectCall") is True,
            "msgCall": body.get("msgCall") or "",
            "groupsIgnore": body.get("groupsIgnore") is True,
            "alwaysOnline": body.get("alwaysOnline") is True,
            "readMessages": body.get("readMessages") is True,
            "readStatus": body.get("readStatus") is True,
            "syncFullHistory": body.get("syncFullHistory") is True,
            "wavoipToken": body.get("wavoipToken") or "",
        },
    }
    if qrcode is not None:
        result["qrcode"] = qrcode
    return result


def message_record(msg: StoredMessage) -> dict[str, Any]:
    """A findMessages record: the Message row plus its MessageUpdate statuses."""
    r = msg.response
    return {
        "id": msg.row_id,
        "key": r["key"],
        "pushName": r["pushName"],
        "messageType": r["messageType"],
        "message": r["message"],
        "messageTimestamp": r["messageTimestamp"],
        "instanceId": r["instanceId"],
        "source": r["source"],
        "contextInfo": r["contextInfo"],
        "MessageUpdate": [{"status": u["status"]} for u in msg.updates],
    }


def root(host_url: str, version: str) -> dict[str, Any]:
    return {
        "status": 200,
        "message": "Welcome to the Evolution API, it is working!",
        "version": version,
        "clientName": CLIENT_NAME,
        "manager": f"{host_url}/manager",
        "documentation": "https://doc.evolution-api.com",
        "whatsappWebVersion": "2.3000.1023204200",
    }
