from typing import Any

from messaging.operators import add_instance

from ._json_command import JsonCommand


class Command(JsonCommand):
    help = "Register an Evolution instance (no --project: a Pilot Status instance)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--name", required=True)
        parser.add_argument("--project", type=int, default=None)
        parser.add_argument("--official", action="store_true")
        parser.add_argument("--priority", type=int, default=100)
        parser.add_argument("--token", default=None, help="the instance's Evolution token (stored hashed)")
        parser.add_argument("--profile", default="unofficial", choices=["unofficial", "official"],
                            help="how the number is paced (docs/sending-policy.md); a new number is unofficial")

    def handle(self, *args: Any, **options: Any) -> None:
        self.run_action(
            add_instance,
            name=options["name"],
            project_id=options["project"],
            official=options["official"],
            priority=options["priority"],
            token=options["token"],
            profile=options["profile"],
        )
