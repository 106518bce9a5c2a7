from typing import Any

from messaging.operators import create_member

from ._json_command import JsonCommand


class Command(JsonCommand):
    help = "Create (or update) a dashboard user and make them a member of a project."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--project", type=int, required=True)
        parser.add_argument("--username", required=True)
        parser.add_argument("--password", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        self.run_action(
            create_member, project_id=options["project"], username=options["username"], password=options["password"]
        )
