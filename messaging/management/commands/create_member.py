from typing import Any

from messaging.operators import create_member

from ._json_command import JsonCommand


class Command(JsonCommand):
    help = (
        "Create a dashboard user and make them a member of a project. An existing user is refused unless "
        "--reset-password is given; a superuser is never changed."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--project", type=int, required=True)
        parser.add_argument("--username", required=True)
        parser.add_argument("--password", required=True)
        parser.add_argument(
            "--reset-password", action="store_true",
            help="the user exists: set this password and add them to the project (never for a superuser)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.run_action(
            create_member, project_id=options["project"], username=options["username"], password=options["password"],
            reset_password=options["reset_password"],
        )
