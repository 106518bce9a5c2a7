from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from messaging.operators import OperatorError


class JsonCommand(BaseCommand):
    """Runs one operator action and prints its result as JSON on stdout (README, "API quick start")."""

    def run_action(self, action: Callable[..., dict[str, Any]], **kwargs: Any) -> None:
        try:
            result = action(**kwargs)
        except OperatorError as exc:
            sys.stderr.write(json.dumps({"error": str(exc)}) + "\n")
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(result))
