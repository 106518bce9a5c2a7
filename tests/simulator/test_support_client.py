"""tests/support/simulator.py, the helper the product's tests drive the simulator with: its calls for
relayed messages, the ban model and the time scale."""

from __future__ import annotations

from tests.support.simulator import SimulatorClient

from .conftest import Json, Simulator


def test_the_helper_drives_relayed_messages_and_the_ban_model(sim: Simulator, inst: Json) -> None:
    client = SimulatorClient(sim.url)
    twin = client.phone_message("my-instance", "5511999999999", "Ok", device="ios")
    assert twin["key"]["fromMe"] is True and twin["source"] == "ios"
    assert client.contact_message("my-instance", "5511988880000", "Oi")["key"]["fromMe"] is False
    assert client.time_scale(1000)["time_scale"] == 1000
    assert client.ban_model(enabled=False, cold_max=5)["ban_model"]["cold_max"] == 5
    assert client.ban_model("my-instance", enabled=True)["ban_model"] == {"enabled": True}
    standing = client.standing("my-instance")
    assert standing["enabled"] is True and standing["warm_contacts"] == 2
    everyone = client.standing()
    assert everyone["time_scale"] == 1000 and everyone["banned"] == [] and "my-instance" in everyone["instances"]
