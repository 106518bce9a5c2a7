"""`manage.py settings_reference [--check]`: write docs/settings.md from the settings' code."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pilot_status.settings_reference import PAGE, render


class Command(BaseCommand):
    help = "Render docs/settings.md from the settings modules (--check: fail when the file is out of date)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="exit 1 when docs/settings.md differs from the code")

    def handle(self, *args: Any, **options: Any) -> None:
        page = render()
        if options["check"]:
            if not PAGE.exists() or PAGE.read_text() != page:
                raise CommandError("docs/settings.md is out of date with the settings: run `make settings-docs`")
            return
        PAGE.write_text(page)
        self.stdout.write(f"wrote {PAGE}")
