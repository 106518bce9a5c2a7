from typing import Any

from messaging.operators import revoke_key

from ._json_command import JsonCommand


class Command(JsonCommand):
    help = "Revoke an API key by its display prefix (e.g. ps_live_AbCd); requests with it then get 401."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--prefix", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        self.run_action(revoke_key, prefix=options["prefix"])
