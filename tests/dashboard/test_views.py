"""Dashboard pages through Django's test client: membership, actions, bulk jobs (no browser)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from dashboard import bulk
from dashboard.models import BulkResendJob
from messaging import operators, opt_ins
from messaging.models import DeadLetter, EventKind, Message, Status
from tests.conftest import add_instance
from tests.messaging.test_resend import RECIPIENT, failed_message


@pytest.fixture
def opted_in(alice):
    opt_ins.record(alice.project, RECIPIENT, "checkout")


@pytest.fixture
def entry(alice, alice_instance, opted_in) -> DeadLetter:
    return failed_message(alice)


@pytest.fixture
def bob_browser(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def carol_member(carol):
    # A member of carol's project only.
    operators.create_member(carol.project.pk, "dave", "dave-password-123")
    client = Client()
    client.force_login(get_user_model().objects.get(username="dave"))
    return client


def urls(entry: DeadLetter) -> dict[str, str]:
    p = entry.project_id
    return {
        "overview": f"/dashboard/p/{p}/",
        "list": f"/dashboard/p/{p}/dead-letters/",
        "detail": f"/dashboard/p/{p}/dead-letters/{entry.pk}/",
        "status": f"/dashboard/p/{p}/messages/{entry.message_id}/status.json",
    }


def test_it_sends_anonymous_people_to_the_login_page(entry):
    response = Client().get(urls(entry)["overview"])
    assert response.status_code == 302 and response["Location"].startswith("/dashboard/login/")


def test_a_member_with_one_project_lands_on_its_overview(bob_browser, entry):
    response = bob_browser.get("/dashboard/")
    assert response.status_code == 302 and response["Location"] == urls(entry)["overview"]


def test_a_member_of_several_projects_picks_one(bob, bob_browser, carol, entry):
    carol.project.members.add(bob)
    response = bob_browser.get("/dashboard/")
    assert response.status_code == 200
    assert b"Alice Store" in response.content and b"Carol Bank" in response.content


def test_the_pages_show_the_projects_data(bob_browser, entry):
    for name in ("overview", "list", "detail"):
        response = bob_browser.get(urls(entry)[name])
        assert response.status_code == 200, name
        assert RECIPIENT.encode() in response.content, name
    assert bob_browser.get(urls(entry)["status"]).json()["status"] == "FAILED"


def test_another_projects_member_gets_404_everywhere(carol_member, entry):
    for url in urls(entry).values():
        assert carol_member.get(url).status_code == 404, url
    response = carol_member.post(urls(entry)["detail"] + "resend")
    assert response.status_code == 404
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


def test_force_resend_button_resends_as_the_member(bob_browser, entry):
    response = bob_browser.post(urls(entry)["detail"] + "resend", follow=True)

    assert response.status_code == 200
    assert b"Resent." in response.content
    message = Message.objects.get(pk=entry.message_id)
    assert message.status == Status.QUEUED
    assert message.events.get(kind=EventKind.RESENT).actor == "dashboard:bob"


def test_a_refused_resend_shows_the_reason(bob_browser, alice, entry):
    opt_ins.revoke(alice.project, RECIPIENT, None)
    response = bob_browser.post(urls(entry)["detail"] + "resend", follow=True)
    assert b"opt_in_required" in response.content
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


def test_actions_need_post_and_a_csrf_token(bob, entry):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(bob)
    assert strict.get(urls(entry)["detail"] + "dismiss").status_code == 405
    assert strict.post(urls(entry)["detail"] + "dismiss").status_code == 403
    assert DeadLetter.objects.get(pk=entry.pk).status == "OPEN"


def test_dismiss_button(bob_browser, entry):
    bob_browser.post(urls(entry)["detail"] + "dismiss")
    assert DeadLetter.objects.get(pk=entry.pk).resolved_by == "dashboard:bob"


def test_the_list_filters_by_reason(bob_browser, entry):
    response = bob_browser.get(urls(entry)["list"], {"reason": "EXPIRED"})
    assert RECIPIENT.encode() not in response.content
    response = bob_browser.get(urls(entry)["list"], {"reason": "INVALID_RECIPIENT", "to": RECIPIENT})
    assert RECIPIENT.encode() in response.content


def test_bulk_resend_of_all_matching_runs_in_chunks(bob_browser, alice, entry):
    more = [failed_message(alice) for _ in range(4)]
    response = bob_browser.post(f"/dashboard/p/{alice.project.pk}/dead-letters/bulk-resend",
                                {"scope": "all", "status": "OPEN", "reason": "INVALID_RECIPIENT"})
    job = BulkResendJob.objects.get()
    assert response["Location"] == f"/dashboard/p/{alice.project.pk}/bulk/{job.pk}/"
    assert job.total == 5 and job.status == "PENDING"

    # the task's unit of work, called directly: two per chunk
    assert bulk.process_chunk(job.pk, size=2)
    job.refresh_from_db()
    assert (job.status, job.resent, job.percent) == ("RUNNING", 2, 40)
    while bulk.process_chunk(job.pk, size=2):
        pass
    job.refresh_from_db()
    assert (job.status, job.resent, job.refused, job.skipped) == ("DONE", 5, 0, 0)
    assert not bulk.process_chunk(job.pk)  # running it again finds nothing to do
    assert all(m.status == Status.QUEUED for m in Message.objects.filter(pk__in=[e.message_id for e in [entry, *more]]))
    progress = bob_browser.get(f"/dashboard/p/{alice.project.pk}/bulk/{job.pk}/progress.json").json()
    assert progress["done"] and progress["percent"] == 100 and progress["resent"] == 5


def test_bulk_resend_of_selected_entries_only(bob_browser, alice, entry):
    other = failed_message(alice)
    bob_browser.post(f"/dashboard/p/{alice.project.pk}/dead-letters/bulk-resend", {"scope": "selected", "ids": [entry.pk]})
    job = BulkResendJob.objects.get()
    bulk.run(job.pk)
    assert DeadLetter.objects.get(pk=entry.pk).status == "RESENT"
    assert DeadLetter.objects.get(pk=other.pk).status == "OPEN"


def test_bulk_resend_counts_refusals_and_ignores_other_projects_ids(bob_browser, alice, carol, entry):
    # Carol's entry is made between alice's two, so only the project scope (not the job's top id) keeps it out.
    add_instance(carol.project, "carol-main")
    opt_ins.record(carol.project, RECIPIENT, "checkout")
    carols = failed_message(carol)
    opt_ins.record(alice.project, "+5511977776666", "checkout")
    refused = failed_message(alice, to="+5511977776666")
    opt_ins.revoke(alice.project, "+5511977776666", None)
    assert entry.pk < carols.pk < refused.pk

    bob_browser.post(f"/dashboard/p/{alice.project.pk}/dead-letters/bulk-resend",
                     {"scope": "selected", "ids": [entry.pk, carols.pk, refused.pk]})
    job = BulkResendJob.objects.get()
    bulk.run(job.pk)
    job.refresh_from_db()
    assert (job.total, job.resent, job.refused, job.skipped) == (2, 1, 1, 0)
    assert DeadLetter.objects.get(pk=entry.pk).status == "RESENT"
    assert DeadLetter.objects.get(pk=refused.pk).status == "OPEN"
    untouched = DeadLetter.objects.get(pk=carols.pk)
    assert (untouched.status, untouched.resolved_by) == ("OPEN", "")
    carols_message = Message.objects.get(pk=carols.message_id)
    assert carols_message.status == Status.FAILED
    assert not carols_message.events.filter(kind=EventKind.RESENT).exists()


def test_a_job_of_another_project_is_404(carol_member, bob_browser, alice, entry):
    bob_browser.post(f"/dashboard/p/{alice.project.pk}/dead-letters/bulk-resend", {"scope": "all"})
    job = BulkResendJob.objects.get()
    assert carol_member.get(f"/dashboard/p/{alice.project.pk}/bulk/{job.pk}/progress.json").status_code == 404


def test_assets_are_served_without_collectstatic(db):
    response = Client().get("/dashboard/assets/app.css")
    assert response.status_code == 200 and response["Content-Type"] == "text/css"
    assert Client().get("/dashboard/assets/..%2Fviews.py").status_code == 404
