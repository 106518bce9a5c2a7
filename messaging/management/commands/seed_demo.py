"""`make run`: create (once) a demo project with instances on the simulator, print keys and a curl line.

Development only. In production mode (DEBUG=0, which `make run` also uses) it refuses unless
`--i-know-this-is-a-demo` is given: `make run` and compose's `demo` profile pass it, nothing else
should. What it makes can never stand in for a real deployment: the demo project is not
production-approved (its TEST key sends to its test number only; no LIVE key is printed), and its
instances, the official one too, come after every real instance (DEMO_PRIORITY).
"""

from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from messaging import operators
from messaging.models import ApiKey, Environment, Instance, Project

DEMO_NAME = "Demo project"
DEMO_NUMBER = "+5511999990000"
OWN_INSTANCE = "demo-instance"
OFFICIAL_INSTANCE = "pilot-status-official"
# Lower goes first: a real instance (default 100) always outranks the demo's, official or not.
DEMO_PRIORITY = 1_000_000
DEMO_FLAG = "--i-know-this-is-a-demo"


class Command(BaseCommand):
    help = "Create the demo project once and write the simulator's instance list."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--state-dir", default=str(settings.BASE_DIR / ".state"))
        parser.add_argument(DEMO_FLAG, dest="demo", action="store_true",
                            help="run in production mode (DEBUG=0) too: make run and compose's demo profile")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG and not options["demo"]:
            raise CommandError(
                "seed_demo makes a demo project, demo instances and prints their keys: it does not run in "
                f"production mode (DEBUG=0) unless {DEMO_FLAG} is given (make run and compose's demo profile do)"
            )
        state_dir = Path(options["state_dir"])
        state_dir.mkdir(parents=True, exist_ok=True)
        saved_path = state_dir / "demo.json"
        saved: dict[str, Any] = json.loads(saved_path.read_text()) if saved_path.exists() else {}

        project = Project.objects.filter(pk=int(saved.get("project_id") or 0), name=DEMO_NAME).first()
        if project is None:
            created = operators.create_project(DEMO_NAME, DEMO_NUMBER, production_approved=False)
            project = Project.objects.get(pk=created["project_id"])
            saved = {**created, "tokens": {}}
        elif not saved.get("test_api_key") or not ApiKey.objects.filter(project=project, revoked_at__isnull=True).exists():
            # Keys are stored hashed; if the local copy is gone, issue fresh ones.
            _, saved["test_api_key"] = ApiKey.issue(project, Environment.TEST)
            _, saved["live_api_key"] = ApiKey.issue(project, Environment.LIVE)

        tokens: dict[str, str] = saved.setdefault("tokens", {})
        for name, project_id, official in ((OWN_INSTANCE, project.pk, False), (OFFICIAL_INSTANCE, None, True)):
            if not Instance.objects.filter(name=name).exists():
                tokens[name] = str(uuid.uuid4()).upper()
                operators.add_instance(name, project_id, official=official, priority=DEMO_PRIORITY, token=tokens[name])
            tokens.setdefault(name, secrets.token_hex(8))
        # A demo seeded before issue 21 was approved and ranked first (priority 10): not any more.
        Project.objects.filter(pk=project.pk).update(production_approved=False)
        Instance.objects.filter(name__in=[OWN_INSTANCE, OFFICIAL_INSTANCE]).update(priority=DEMO_PRIORITY)
        saved_path.touch(mode=0o600)  # created private: it holds the demo's keys
        saved_path.write_text(json.dumps(saved, indent=2))
        saved_path.chmod(0o600)

        # Where Evolution (here: the simulator) posts events: the webhook pool (scripts/env.sh sets
        # INTERNAL_WEBHOOK_URL to WEBHOOK_PORT; docker-compose names the webhook service).
        webhook_url = settings.INTERNAL_WEBHOOK_URL
        preload = []
        instances = list(Instance.objects.filter(name__in=[OWN_INSTANCE, OFFICIAL_INSTANCE]).order_by("name"))
        for instance in instances:
            preload.append(
                {
                    "name": instance.name,
                    "token": tokens[instance.name],
                    "state": "open",
                    "webhook": {
                        "enabled": True,
                        "url": webhook_url,
                        "byEvents": False,
                        "headers": {"x-webhook-token": instance.webhook_token},
                        "events": [],
                    },
                    "rabbitmq": {"enabled": False, "events": []},
                }
            )
        (state_dir / "simulator-instances.json").write_text(json.dumps(preload, indent=2))

        base = f"http://127.0.0.1:{settings.PORT}"
        body = json.dumps({"to": DEMO_NUMBER, "category": "OTP", "text": "Your code is {{code}}", "variables": {"code": "123456"}})
        self.stdout.write(
            "\n".join(
                [
                    "",
                    f"Demo project #{project.pk} ({DEMO_NAME}); test number {DEMO_NUMBER}",
                    f"  TEST key: {saved['test_api_key']}  (sends to the test number only; the demo is not"
                    " production-approved)",
                    f"  instances: {OWN_INSTANCE} (the project's), {OFFICIAL_INSTANCE} (official Pilot Status),"
                    f" priority {DEMO_PRIORITY}: after every real instance",
                    *(f"  webhook token of {instance.name} (x-webhook-token): {instance.webhook_token}"
                      for instance in instances),
                    "Send a message:",
                    f"  curl -s -X POST {base}/v1/messages/send -H 'Authorization: Bearer {saved['test_api_key']}' "
                    f"-H 'Content-Type: application/json' -d '{body}'",
                    "Then: curl -s -H 'Authorization: Bearer <key>' " + base + "/v1/messages/<id>",
                    f"Admin: {base}/admin/ (python3 manage.py createsuperuser)   API docs: {base}/v1/docs/",
                    "",
                ]
            )
        )
