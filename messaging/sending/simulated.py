"""The simulated Evolution behind a TEST magic number (messaging.test_numbers).

`answer` builds the HTTP answer Evolution would give (the shapes of tests/simulator/samples)
and hands it to `gateway.classify`, the seam every real answer goes through, so the worker records it
exactly as a real one: an attempt, a retry with backoff, SENT, or FAILED with a dead letter.
`receive_receipts` then moves a sent message forward as Evolution's receipts would, through the same
forward-only compare-and-set (`lifecycle.advance`) the webhook's receipts use.

Nothing here calls Evolution, and nothing feeds the circuit breakers or the instance's send slot: a
simulated failure must not open the circuit of the real instance the project's LIVE messages use.
"""

from __future__ import annotations

import uuid
from typing import Any

from .. import lifecycle
from ..models import Message
from ..test_numbers import INSTANCE_NOT_FOUND, NOT_ON_WHATSAPP, SENT, Scenario
from . import gateway

# Evolution's receipt statuses → ours, as ingestion.handlers.RECEIPT_STATUS maps them.
_RECEIPTS = {"SERVER_ACK": "SERVER_ACK", "DELIVERY_ACK": "DELIVERED", "READ": "READ"}
SOURCE = "test_number"  # the STATUS lines' source (a webhook's say "evolution")


def _http_answer(kind: str, message: Message) -> tuple[int, Any]:
    digits = gateway.digits(message.to)
    if kind == SENT:
        return 201, {
            "key": {"remoteJid": f"{digits}@s.whatsapp.net", "fromMe": True,
                    "id": message.own_message_id or "3EB0" + uuid.uuid4().hex[:18].upper()},
            "message": {"conversation": message.text}, "messageType": "conversation", "status": "PENDING",
            "source": "test_number",
        }
    if kind == NOT_ON_WHATSAPP:
        return 400, {"status": 400, "error": "Bad Request", "response": {
            "message": [{"jid": f"{digits}@s.whatsapp.net", "exists": False, "number": digits}]}}
    if kind == INSTANCE_NOT_FOUND:
        return 404, {"status": 404, "error": "Not Found", "response": {
            "message": [f'The "{message.instance.name}" instance does not exist']}}
    return 503, {"status": 503, "error": "Service Unavailable", "response": {"message": ["simulated (TEST number)"]}}


def answer(message: Message, scenario: Scenario) -> gateway.Outcome:
    """This attempt's answer: the scenario's entry for the attempt about to be made (the last repeats)."""
    kind = scenario.answers[min(message.attempts, len(scenario.answers) - 1)]
    status_code, body = _http_answer(kind, message)
    outcome = gateway.classify(status_code, body)
    # The timeline says it was simulated; everything else is the real classification's.
    detail = f"{outcome.detail} (simulated: TEST number, {scenario.name})".strip()
    return gateway.Outcome(**{**outcome.__dict__, "detail": detail, "extra": {"simulated": scenario.name}})


def receive_receipts(message: Message, scenario: Scenario) -> None:
    for status in scenario.receipts:
        lifecycle.advance(message, _RECEIPTS[status], source=SOURCE, evolutionStatus=status)
