"""JSON-schema validation with the messages Evolution returns.

Evolution validates bodies with the ``jsonschema`` npm package and maps each error to the
schema's ``description`` when it has one, otherwise to the error stack with the first
``instance.`` removed (``dataValidate`` in src/api/abstract/abstract.router.ts). This module
implements the handful of keywords Evolution's schemas use, in schema-key order like the
npm validator, so messages and their order match.
"""

from __future__ import annotations

import json
import re
from typing import Any

Schema = dict[str, Any]

# EventController.events (src/api/integrations/event/event.controller.ts): the names
# webhook/set and rabbitmq/set accept, and what an enabled row with no events stores.
EVENTS: list[str] = [
    "APPLICATION_STARTUP", "QRCODE_UPDATED", "MESSAGES_SET", "MESSAGES_UPSERT", "MESSAGES_EDITED",
    "MESSAGES_UPDATE", "MESSAGES_DELETE", "SEND_MESSAGE", "CONTACTS_SET", "CONTACTS_UPSERT",
    "CONTACTS_UPDATE", "PRESENCE_UPDATE", "CHATS_SET", "CHATS_UPSERT", "CHATS_UPDATE", "CHATS_DELETE",
    "GROUPS_UPSERT", "GROUP_UPDATE", "GROUP_PARTICIPANTS_UPDATE", "CONNECTION_UPDATE", "LABELS_EDIT",
    "LABELS_ASSOCIATION", "CALL", "TYPEBOT_START", "TYPEBOT_CHANGE_STATUS", "REMOVE_INSTANCE",
    "LOGOUT_INSTANCE",
]


def _js(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    return str(value)


def _is_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == "integer":
        return isinstance(value, int) or value.is_integer()
    return kind == "number"


def _check(schema: Schema, value: Any, path: str, out: list[tuple[str, Schema]]) -> None:
    for key, rule in schema.items():
        if key == "type":
            if not _is_type(value, rule):
                out.append((f"{path} is not of a type(s) {rule}", schema))
        elif key == "enum":
            if not any(value == v and type(value) is type(v) for v in rule):
                out.append((f"{path} is not one of enum values: {','.join(_js(v) for v in rule)}", schema))
        elif key == "properties" and isinstance(value, dict):
            for name, sub in rule.items():
                if name in value:
                    _check(sub, value[name], f"{path}.{name}", out)
        elif key == "required" and isinstance(value, dict):
            for name in rule:
                if name not in value:
                    out.append((f'{path} requires property "{name}"', schema))
        elif key == "items" and isinstance(value, list):
            for i, item in enumerate(value):
                _check(rule, item, f"{path}[{i}]", out)
        elif key in ("minItems", "minLength") and isinstance(value, list if key == "minItems" else str):
            if len(value) < rule:
                out.append((f"{path} does not meet minimum length of {rule}", schema))
        elif key == "uniqueItems" and rule and isinstance(value, list):
            seen = [json.dumps(v, sort_keys=True) for v in value]
            if len(set(seen)) != len(seen):
                out.append((f"{path} contains duplicate item", schema))
        elif key == "pattern" and isinstance(value, str):
            if not re.search(rule, value):
                out.append((f"{path} does not match pattern {json.dumps(rule)}", schema))
        elif key == "if" and isinstance(value, dict):
            # Evolution's isNotEmpty(): "if every key is one of these, they must be non-empty".
            names = rule["propertyNames"]["enum"]
            if all(k in names for k in value):
                _check(schema["then"], value, path, out)


def validate(schema: Schema, body: Any) -> list[str]:
    found: list[tuple[str, Schema]] = []
    _check(schema, body, "instance", found)
    return [failing.get("description") or stack.replace("instance.", "", 1) for stack, failing in found]


def _not_empty(*names: str) -> Schema:
    return {
        "if": {"propertyNames": {"enum": list(names)}},
        "then": {"properties": {n: {"minLength": 1, "description": f'The "{n}" cannot be empty'} for n in names}},
    }


_NUMBER = {"type": "string", "description": "Invalid format"}
_DELAY = {"type": "integer", "description": "Enter a value in milliseconds"}

# src/validate/message.schema.ts textMessageSchema
TEXT_MESSAGE: Schema = {
    "type": "object",
    "properties": {
        "number": _NUMBER,
        "text": {"type": "string"},
        "linkPreview": {"type": "boolean"},
        "delay": _DELAY,
        "quoted": {
            "properties": {
                "key": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "remoteJid": {"type": "string"},
                        "fromMe": {"type": "boolean", "enum": [True, False]},
                    },
                    "required": ["id"],
                    **_not_empty("id"),
                },
                "message": {"type": "object"},
            }
        },
        "everyOne": {"type": "boolean", "enum": [True, False]},
        "mentioned": {
            "type": "array",
            "minItems": 1,
            "uniqueItems": True,
            "items": {"type": "string", "pattern": "^\\d+", "description": '"mentioned" must be an array of numeric strings'},
        },
    },
    "required": ["number", "text"],
}

# src/validate/chat.schema.ts
PRESENCE: Schema = {
    "type": "object",
    "properties": {
        "number": _NUMBER,
        "delay": {"type": "number"},
        "presence": {"type": "string", "enum": ["unavailable", "available", "composing", "recording", "paused"]},
    },
    "required": ["number", "presence", "delay"],
}

WHATSAPP_NUMBERS: Schema = {
    "type": "object",
    "properties": {
        "numbers": {
            "type": "array",
            "minItems": 1,
            "uniqueItems": True,
            "items": {"type": "string", "description": '"numbers" must be an array of numeric strings'},
        }
    },
}

MESSAGE_UP: Schema = {
    "type": "object",
    "properties": {
        "where": {
            "type": "object",
            "properties": {
                "_id": {"type": "string"},
                "remoteJid": {"type": "string"},
                "id": {"type": "string"},
                "fromMe": {"type": "boolean", "enum": [True, False]},
                "participant": {"type": "string"},
                "status": {"type": "string", "enum": ["ERROR", "PENDING", "SERVER_ACK", "DELIVERY_ACK", "READ", "PLAYED"]},
            },
            **_not_empty("_id", "remoteJid", "id", "status"),
        },
        "limit": {"type": "integer"},
    },
}

MESSAGE_QUERY: Schema = {
    "type": "object",
    "properties": {
        "where": {
            "type": "object",
            "properties": {
                "_id": {"type": "string", "minLength": 1},
                "key": {
                    "type": "object",
                    "if": {"propertyNames": {"enum": ["fromMe", "remoteJid", "id"]}},
                    "then": {
                        "properties": {
                            "remoteJid": {"type": "string", "minLength": 1, "description": "The property cannot be empty"},
                            "id": {"type": "string", "minLength": 1, "description": "The property cannot be empty"},
                            "fromMe": {"type": "boolean", "enum": [True, False]},
                        }
                    },
                },
                "message": {"type": "object"},
            },
            **_not_empty("_id"),
        },
        "limit": {"type": "integer"},
    },
}

_EVENT_LIST = {"type": "array", "minItems": 0, "items": {"type": "string", "enum": EVENTS}}

# src/api/integrations/event/webhook/validate/webhook.schema.ts
WEBHOOK: Schema = {
    "type": "object",
    "properties": {
        "webhook": {
            "type": "object",
            "properties": {
                "enabled": {"type": "boolean"},
                "url": {"type": "string"},
                "headers": {"type": "object"},
                "byEvents": {"type": "boolean"},
                "base64": {"type": "boolean"},
                "events": _EVENT_LIST,
            },
            "required": ["enabled", "url"],
            **_not_empty("enabled", "url"),
        }
    },
    "required": ["webhook"],
}

# src/api/integrations/event/rabbitmq/validate/rabbitmq.schema.ts
RABBITMQ: Schema = {
    "type": "object",
    "properties": {
        "rabbitmq": {
            "type": "object",
            "properties": {"enabled": {"type": "boolean", "enum": [True, False]}, "events": _EVENT_LIST},
            "required": ["enabled"],
            **_not_empty("enabled"),
        }
    },
    "required": ["rabbitmq"],
}

# src/validate/instance.schema.ts (the fields this simulator reads)
INSTANCE: Schema = {
    "type": "object",
    "properties": {
        "instanceName": {"type": "string"},
        "token": {"type": "string"},
        "number": {"type": "string", "pattern": "^\\d+[\\.@\\w-]+"},
        "qrcode": {"type": "boolean"},
        "integration": {"type": "string", "enum": ["WHATSAPP-BAILEYS", "WHATSAPP-BUSINESS", "EVOLUTION"]},
        "webhook": {"type": "object"},
        "rabbitmq": {"type": "object"},
    },
    **_not_empty("instanceName"),
}
