"""Standard Webhooks signatures: the specification's own test vector, and what a receiver checks."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from callbacks import signing
from callbacks.models import new_secret

# From standard-webhooks/standard-webhooks libraries/python/tests/test_webhooks.py (test_sign_function).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TIMESTAMP = 1614265330
VECTOR_BODY = '{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_signature_matches_the_specifications_test_vector():
    at = datetime.fromtimestamp(VECTOR_TIMESTAMP, tz=timezone.utc)
    headers = signing.headers(VECTOR_SECRET, VECTOR_ID, at, VECTOR_BODY)
    assert headers == {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TIMESTAMP),
        "webhook-signature": VECTOR_SIGNATURE,
    }


def test_a_receiver_verifies_our_headers_and_refuses_a_changed_body():
    secret = new_secret()
    assert secret.startswith("whsec_") and len(secret) == len("whsec_") + 32
    body = '{"type":"message.status","data":{"status":"READ"}}'
    headers = signing.headers(secret, "msg_1", datetime.now(timezone.utc), body)
    assert Webhook(secret).verify(body, headers)["data"]["status"] == "READ"
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace("READ", "SENT"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)
