from typing import Any

from messaging.operators import issue_key

from ._json_command import JsonCommand


class Command(JsonCommand):
    help = "Issue a new API key for a project (shown once), e.g. to rotate a leaked one."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--project", type=int, required=True)
        parser.add_argument("--environment", choices=["TEST", "LIVE"], required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        self.run_action(issue_key, project_id=options["project"], environment=options["environment"])
