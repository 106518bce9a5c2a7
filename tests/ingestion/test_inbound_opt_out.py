"""Inbound opt-out (issue 23 §3): an opt-out keyword written to a project's instance revokes that project's
opt-in for the sender (to a shared instance: every project's), with its source; later non-OTP sends are refused
`opt_in_required`."""

from __future__ import annotations

import copy
import uuid

import pytest
import requests

from ingestion import handlers, inbox
from ingestion.models import IngestionEvent
from messaging import opt_ins, opt_outs
from messaging.accept import SendRequest, accept_message
from messaging.errors import Rejected
from messaging.models import OptIn
from tests.conftest import add_instance
from tests.ingestion.helpers import rabbit_copy, sample
from tests.support.simulator import wait_until

SENDER = "+5511988887777"
UPSERT = "webhook.messages.upsert.inbound-text.json"


def inbound(text: str, jid: str = "5511988887777@s.whatsapp.net", instance: str = "alice-main", **key: object) -> dict:
    payload = sample(UPSERT, instance)
    payload["data"]["key"] = {"remoteJid": jid, "fromMe": False, "id": uuid.uuid4().hex.upper(), **key}
    payload["data"]["message"] = {"conversation": text}
    return payload


def ingest(payload, channel="WEBHOOK"):
    event, _ = inbox.record(channel, payload)
    return handlers.apply(event), IngestionEvent.objects.get(pk=event.pk)


def live(alice, phone=SENDER) -> OptIn | None:
    return OptIn.objects.filter(project=alice.project, phone=phone, revoked_at__isnull=True).first()


@pytest.fixture
def opted_in(alice, alice_instance):
    opt_ins.record(alice.project, SENDER, "checkout")


@pytest.mark.parametrize("text", ["STOP", " stop ", "Parar", "SAIR", "cancelar", "Baja", "Cancelar suscripción",
                                  "  CANCELAR   SUSCRIPCION\n", "Unsubscribe", "DESCADASTRAR", "stop all"])
def test_a_keyword_revokes_the_projects_opt_in_with_its_source(alice, opted_in, text):
    outcome, event = ingest(inbound(text))

    assert outcome == opt_outs.REVOKED and event.processed_at is not None
    assert live(alice) is None
    row = OptIn.objects.get(project=alice.project, phone=SENDER)
    assert row.revoked_source == "inbound_keyword" and row.revoked_by == "inbound_keyword"
    assert row.revoked_reference == f"inbox:{event.pk}"


@pytest.mark.parametrize("text", ["please stop", "STOP!!! now", "stopp", "Sim, confirmo!", ""])
def test_other_texts_change_nothing(alice, opted_in, text):
    outcome, _ = ingest(inbound(text))

    assert outcome == "stored"
    assert live(alice) is not None


def test_later_non_otp_sends_are_refused_opt_in_required(alice, opted_in):
    ingest(inbound("STOP"))

    with pytest.raises(Rejected) as refused:
        accept_message(alice.project, None, "LIVE", SendRequest(to=SENDER, category="UTILITY", template="Hi"))
    assert refused.value.code == "opt_in_required"


def test_the_same_event_on_both_channels_revokes_once(alice, opted_in):
    payload = inbound("STOP")
    first, event = ingest(payload, "WEBHOOK")
    second = handlers.ingest("RABBITMQ", rabbit_copy(payload))

    assert first == opt_outs.REVOKED and second == handlers.ALREADY_PROCESSED
    assert IngestionEvent.objects.filter(event="messages.upsert").count() == 1
    assert OptIn.objects.get(project=alice.project, phone=SENDER).revoked_reference == f"inbox:{event.pk}"


def test_a_second_stop_keeps_the_first_revocation(alice, opted_in):
    _, first = ingest(inbound("STOP"))
    revoked_at = OptIn.objects.get(project=alice.project).revoked_at

    assert ingest(inbound("PARAR"))[0] == opt_outs.NOT_OPTED_IN
    row = OptIn.objects.get(project=alice.project)
    assert row.revoked_at == revoked_at and row.revoked_reference == f"inbox:{first.pk}"


def test_keywords_are_the_projects_own(alice, opted_in):
    alice.project.opt_out_keywords = ["CHEGA"]
    alice.project.save()

    assert ingest(inbound("stop"))[0] == "stored"
    assert live(alice) is not None
    assert ingest(inbound("Chega"))[0] == opt_outs.REVOKED


def test_only_the_instances_project_is_revoked(alice, carol, opted_in):
    opt_ins.record(carol.project, SENDER, "newsletter")
    add_instance(carol.project, "carol-main")

    ingest(inbound("STOP", instance="alice-main"))

    assert live(alice) is None
    assert OptIn.objects.filter(project=carol.project, revoked_at__isnull=True).count() == 1


def test_our_own_messages_and_groups_are_not_opt_outs(alice, opted_in):
    assert ingest(inbound("STOP", fromMe=True))[0] == "stored"
    assert ingest(inbound("STOP", jid="120363000000000000@g.us"))[0] == "stored"
    assert live(alice) is not None


def test_a_lid_sender_uses_remote_jid_alt_or_sender_pn(alice, opted_in):
    assert ingest(inbound("STOP", jid="123456789012345@lid", remoteJidAlt="5511988887777@s.whatsapp.net"))[0] \
        == opt_outs.REVOKED
    opt_ins.record(alice.project, SENDER, "checkout again")
    assert ingest(inbound("SAIR", jid="123456789012345@lid", senderPn="5511988887777@s.whatsapp.net"))[0] \
        == opt_outs.REVOKED


def test_a_lid_sender_without_its_number_records_nothing_and_says_why(alice, opted_in, caplog):
    outcome, event = ingest(inbound("STOP", jid="123456789012345@lid"))

    assert outcome == "opt_out_sender_unknown" and event.processed_at is not None
    assert live(alice) is not None
    assert "LID" in caplog.text and "123456789012345@lid" in caplog.text


def test_brazils_ninth_digit_either_way(alice, alice_instance):
    opt_ins.record(alice.project, "+5531999998888", "checkout")

    # WhatsApp's jid for a Belo Horizonte mobile drops the ninth digit (docs/evolution-setup.md, "Ids and jids")
    assert ingest(inbound("PARAR", jid="553199998888@s.whatsapp.net"))[0] == opt_outs.REVOKED
    assert live(alice, "+5531999998888") is None


def test_a_pilot_status_instance_revokes_every_projects_opt_in_for_the_number(alice, carol, opted_in, official_instance):
    # A shared number speaks for every project that uses it (docs/security.md, "Consent"); tests/messaging/
    # test_consent_at_send.py follows their queued messages.
    opt_ins.record(carol.project, SENDER, "newsletter")
    opt_ins.record(carol.project, "+5511977776666", "newsletter")

    assert ingest(inbound("STOP", instance=official_instance.name))[0] == opt_outs.REVOKED
    assert live(alice) is None and live(carol) is None
    assert live(carol, "+5511977776666") is not None


def test_the_api_revocation_records_its_source(alice, opted_in):
    response = alice.client().delete(f"/v1/opt-ins/{SENDER}")
    assert response.status_code in (200, 204), response.content
    assert OptIn.objects.get(project=alice.project).revoked_source == "api"


def test_keywords_are_editable_in_admin(alice, admin_client):
    page = admin_client.get(f"/admin/messaging/project/{alice.project.pk}/change/")
    assert page.status_code == 200 and b"opt_out_keywords" in page.content and b"DESCADASTRAR" in page.content


# ---- the real stack ------------------------------------------------------------------------

def test_stop_over_both_channels_revokes_once_and_the_next_send_is_refused(stack, simulator, alice, alice_instance):
    simulator.register(alice_instance, stack.webhook_url)
    opt_ins.record(alice.project, SENDER, "checkout")
    data = copy.deepcopy(inbound("Stop")["data"])

    # when: Evolution emits the recipient's STOP through the webhook and RabbitMQ at once
    simulator.emit(alice_instance.name, "messages.upsert", data)

    # then: one inbox row, processed, and the opt-in revoked with its source
    wait_until(lambda: live(alice) is None, timeout=20, message="the opt-in revoked")
    rows = IngestionEvent.objects.filter(event="messages.upsert")
    wait_until(lambda: rows.filter(processed_at__isnull=False).count() == 1, timeout=20, message="processed")
    assert rows.count() == 1 and rows.get().outcome == opt_outs.REVOKED
    row = OptIn.objects.get(project=alice.project, phone=SENDER)
    assert row.revoked_source == "inbound_keyword" and row.revoked_reference == f"inbox:{rows.get().pk}"

    # and a later UTILITY send is refused with opt_in_required, storing nothing
    answer = requests.post(f"{stack.web_url}/v1/messages/send", headers={"Authorization": f"Bearer {alice.live_key}"},
                           json={"to": SENDER, "category": "UTILITY", "text": "Your order shipped"}, timeout=30)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "opt_in_required"


@pytest.mark.parametrize("key, message", [
    ({"remoteJid": 5511988887777, "fromMe": False}, {"conversation": "STOP"}),
    ({"remoteJid": "abc@s.whatsapp.net", "fromMe": False}, {"conversation": "STOP"}),
    ({"remoteJid": "9" * 40 + "@s.whatsapp.net", "fromMe": False}, {"conversation": "STOP"}),
    ({"remoteJid": "1@lid", "fromMe": False, "remoteJidAlt": ["x"], "senderPn": {"a": 1}}, {"conversation": "STOP"}),
    ({"remoteJid": "5511988887777:12@s.whatsapp.net", "fromMe": False}, {"extendedTextMessage": {"text": "Stop"}}),
    ({"remoteJid": "5511988887777@s.whatsapp.net", "fromMe": "false"}, {"conversation": "STOP"}),
    ({"remoteJid": "5511988887777@s.whatsapp.net", "fromMe": False}, {"conversation": "\ud800STOP\x00"}),
    ({"remoteJid": "5511988887777@s.whatsapp.net", "fromMe": False}, {"conversation": "STOP" * 10_000}),
    ({"remoteJid": "5511988887777@s.whatsapp.net", "fromMe": False}, {"extendedTextMessage": "STOP"}),
    ("not a key", {"conversation": "STOP"}),
])
def test_odd_shapes_never_raise(alice, opted_in, key, message):
    handlers_data = {"key": key, "message": message}
    outcome = handlers._inbound(IngestionEvent(instance_name="alice-main", pk=1), handlers_data)
    assert isinstance(outcome, str) and len(outcome) <= 40
    # only the device-suffixed jid with a real keyword is a revocation
    assert (live(alice) is None) == (outcome == opt_outs.REVOKED)


def test_admin_lists_revocations_by_source(alice, opted_in, admin_client):
    ingest(inbound("STOP"))
    page = admin_client.get("/admin/messaging/optin/?revoked_source=inbound_keyword")
    assert page.status_code == 200 and SENDER.encode() in page.content and b"inbox:" in page.content
