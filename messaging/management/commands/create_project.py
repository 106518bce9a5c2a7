from typing import Any

from messaging.operators import create_project

from ._json_command import JsonCommand


class Command(JsonCommand):
    help = "Create a project with a TEST and a LIVE API key (printed once)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--name", required=True)
        parser.add_argument("--test-number", required=True, help="E.164, e.g. +5511999990000")
        parser.add_argument("--production-approved", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        self.run_action(
            create_project,
            name=options["name"],
            test_number=options["test_number"],
            production_approved=options["production_approved"],
        )
