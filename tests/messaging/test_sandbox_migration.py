"""Migration messaging 0015 gives existing rows their environment (issue 45 §1, docs/security.md "The sandbox
rule"): a consent recorded by a TEST key becomes TEST, every other LIVE; a stored Idempotency-Key answer takes
its message's environment."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from messaging.models import Environment, IdempotencyRecord, Message, OptIn


def test_existing_consents_and_answers_get_their_environment(transactional_db, alice, alice_instance):
    consents = {
        created_by: OptIn.objects.create(project=alice.project, phone=phone, source="form", created_by=created_by).pk
        for created_by, phone in (("ps_test_AbCd", "+5511988880001"), ("ps_live_EfGh", "+5511988880002"),
                                  ("", "+5511988880003"), ("ps_testXnope", "+5511988880004"))
    }
    test_message = Message.objects.create(
        project=alice.project, environment=Environment.TEST, category="UTILITY", to=alice.project.test_number,
        template="hi", text="hi", instance=alice_instance, deliver_until=timezone.now() + timedelta(hours=1),
    )
    answers = {
        environment: IdempotencyRecord.objects.create(
            project=alice.project, key=f"key-{environment}", request_hash="h", status_code=202,
            response={"id": str(message_id)},
        ).pk
        for environment, message_id in ((Environment.TEST, test_message.pk), (Environment.LIVE, "unknown"))
    }
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([("messaging", "0014_status_lines_and_revocations_indexes")])
        executor = MigrationExecutor(connection)
        executor.migrate([("messaging", "0015_environment_scopes")])
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

    environments = dict(OptIn.objects.values_list("pk", "environment"))
    assert environments[consents["ps_test_AbCd"]] == Environment.TEST
    assert {environments[consents[who]] for who in ("ps_live_EfGh", "", "ps_testXnope")} == {Environment.LIVE}
    assert IdempotencyRecord.objects.get(pk=answers[Environment.TEST]).environment == Environment.TEST
    assert IdempotencyRecord.objects.get(pk=answers[Environment.LIVE]).environment == Environment.LIVE
