from typing import Any

from messaging.operators import revoke_key

from ._json_command import JsonCommand


class Command(JsonCommand):
    help = (
        "Revoke one API key, by its id (--key-id, as issue_key prints it) or by its display prefix "
        "(--prefix ps_live_AbCd) when no other active key shares it; requests with it then get 401."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--key-id", type=int, default=None, help="the key's id (issue_key's key_id, admin's id)")
        parser.add_argument("--prefix", default=None, help="the 12-character prefix shown in admin")

    def handle(self, *args: Any, **options: Any) -> None:
        self.run_action(revoke_key, key_id=options["key_id"], prefix=options["prefix"])
