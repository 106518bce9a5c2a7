from typing import Any

from messaging.operators import webhook_token

from ._json_command import JsonCommand


class Command(JsonCommand):
    help = "Print an instance's webhook token (x-webhook-token), e.g. to re-register its webhook with Evolution."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--name", required=True)
        parser.add_argument("--rotate", action="store_true",
                            help="draw a new salt first: the old token stops working (re-register the new one)")

    def handle(self, *args: Any, **options: Any) -> None:
        self.run_action(webhook_token, name=options["name"], rotate=options["rotate"])
