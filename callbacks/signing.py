"""Standard Webhooks signatures (https://www.standardwebhooks.com), through the `standardwebhooks`
package (tests/callbacks/test_signing.py checks it against the specification's test vector)."""

from __future__ import annotations

from datetime import datetime

from standardwebhooks.webhooks import Webhook


def headers(secret: str, webhook_id: str, at: datetime, body: str) -> dict[str, str]:
    """The three headers a receiver verifies: the signature covers `id.timestamp.body`."""
    signature = Webhook(secret).sign(msg_id=webhook_id, timestamp=at, data=body)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }
