"""Drops callbacks_optin_revoked: messaging 0014 indexes the same rows as `optin_revoked` (a model index), and
with two equal indexes the planner picked either (tests/callbacks/test_derive_plans.py names the one it must
use). Concurrently, as 0014 built its own: a revocation is never blocked meanwhile."""

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("callbacks", "0001_initial"),
        ("messaging", "0014_status_lines_and_revocations_indexes"),
    ]

    operations = [
        migrations.RunSQL(
            "DROP INDEX CONCURRENTLY IF EXISTS callbacks_optin_revoked",
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS callbacks_optin_revoked ON messaging_optin (revoked_at) "
            "WHERE revoked_at IS NOT NULL",
        ),
    ]
