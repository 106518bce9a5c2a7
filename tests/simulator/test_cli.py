"""`python -m simulator`: preload file, environment defaults, clean shutdown on SIGTERM."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import requests

from .conftest import start_simulator


def test_preload_env_key_and_sigterm(tmp_path: Path) -> None:
    preload = tmp_path / "instances.json"
    preload.write_text(json.dumps([{"name": "preloaded", "token": "PRE-TOKEN", "state": "connecting"}]))
    # No RabbitMQ: this is about preload, the key from the environment and a clean SIGTERM; right
    # after a fault test has restarted RabbitMQ, a reconnecting publisher made the stop slow (CI).
    url, process = start_simulator("--preload", str(preload), env={"SIMULATOR_API_KEY": "",
                                                                  "EVOLUTION_API_KEY": "FROM-ENV",
                                                                  "SIMULATOR_RABBITMQ_URL": "",
                                                                  "EVOLUTION_RABBITMQ_URL": ""})
    try:
        state = requests.get(f"{url}/instance/connectionState/preloaded", headers={"apikey": "FROM-ENV"}, timeout=5)
        assert state.json() == {"instance": {"instanceName": "preloaded", "state": "connecting"}}
        token = requests.get(f"{url}/instance/fetchInstances", headers={"apikey": "PRE-TOKEN"}, timeout=5)
        assert [row["name"] for row in token.json()] == ["preloaded"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
