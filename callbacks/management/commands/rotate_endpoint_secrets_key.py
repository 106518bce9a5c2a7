import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from callbacks import secret_storage


class Command(BaseCommand):
    help = (
        "Re-encrypt every webhook endpoint's signing secret under the first key of ENDPOINT_SECRET_KEYS (the "
        "secrets themselves do not change). Prints {\"rotated\": N, \"unreadable\": [endpoint ids]}; exits 1 "
        "while a secret no configured key reads remains (keep the old key listed until it names none)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        result = secret_storage.rotate_all()
        self.stdout.write(json.dumps(result))
        if result["unreadable"]:
            sys.stderr.write(json.dumps({"error": "some endpoint secrets could not be read with any configured key",
                                         "unreadable": result["unreadable"]}) + "\n")
            raise CommandError("unreadable endpoint secrets remain")
