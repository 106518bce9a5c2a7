"""A small client for the simulator's control API (simulator/README.md)."""

from __future__ import annotations

import time
from typing import Any

import requests


class SimulatorClient:
    def __init__(self, base_url: str, process: Any = None):
        self.base_url = base_url
        self.process = process
        self.http = requests.Session()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self.http.post(f"{self.base_url}{path}", json=body or {}, timeout=10)
        response.raise_for_status()
        return response.json()

    def reset(self) -> None:
        self._post("/_control/reset")

    def instance(self, name: str, **config: Any) -> dict[str, Any]:
        return self._post(f"/_control/instances/{name}", config)

    def faults(self, name: str, **faults: Any) -> dict[str, Any]:
        return self._post(f"/_control/instances/{name}", {"faults": faults})

    def set_global(self, **config: Any) -> dict[str, Any]:
        return self._post("/_control/global", config)

    def emit(self, instance: str, event: str, data: dict[str, Any]) -> Any:
        return self._post("/_control/emit", {"instance": instance, "event": event, "data": data})

    def sends(self, **filters: str) -> list[dict[str, Any]]:
        response = self.http.get(f"{self.base_url}/_control/sends", params=filters, timeout=10)
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        response = self.http.get(f"{self.base_url}/_control/stats", timeout=10)
        response.raise_for_status()
        return response.json()

    def phone_message(self, instance: str, number: str, text: str, **fields: Any) -> dict[str, Any]:
        """A message typed on the instance's phone (`device`, `at`, `id` optional): Evolution gets it as
        messages.upsert with fromMe true and files it for findMessages. Answers that record."""
        return self._post(f"/_control/instances/{instance}/messages", {"number": number, "text": text, **fields})

    def contact_message(self, instance: str, number: str, text: str, **fields: Any) -> dict[str, Any]:
        """A message the contact wrote to the instance (messages.upsert, fromMe false): the contact is warm."""
        return self._post(f"/_control/instances/{instance}/messages",
                          {"number": number, "text": text, "from_me": False, **fields})

    def ban_model(self, instance: str | None = None, **rules: Any) -> dict[str, Any]:
        """Turn on (`enabled=True`) or tune the ban model for one instance, or for all when `instance` is None."""
        if instance is None:
            return self.set_global(ban_model=rules)
        return self.instance(instance, ban_model=rules)

    def time_scale(self, scale: float) -> dict[str, Any]:
        """Model seconds per real second for every duration of the ban model."""
        return self.set_global(time_scale=scale)

    def standing(self, instance: str | None = None) -> dict[str, Any]:
        """One instance's standing with the ban model, or every instance's (with `banned` and `disconnected`)."""
        path = f"/_control/instances/{instance}" if instance else "/_control/standing"
        response = self.http.get(f"{self.base_url}{path}", timeout=10)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body["standing"] if instance else body

    def register(self, instance: Any, webhook_url: str, token: str | None = None, **extra: Any) -> dict[str, Any]:
        """Create `instance` on the simulator with a webhook back to the product (x-webhook-token)."""
        config: dict[str, Any] = {
            "state": "open",
            "webhook": {
                "enabled": True,
                "url": webhook_url,
                "byEvents": False,
                "headers": {"x-webhook-token": instance.webhook_token},
                "events": [],
            },
            "faults": {"ack_delays_ms": {"SERVER_ACK": 5, "DELIVERY_ACK": 10, "READ": 15}},
        }
        if token:
            config["token"] = token
        config.update(extra)
        return self.instance(instance.name, **config)


def wait_until(predicate: Any, timeout: float = 15.0, interval: float = 0.05, message: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}; last={last!r}")
