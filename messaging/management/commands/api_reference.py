"""`manage.py api_reference [--check]`: write docs/api.md from the client API's OpenAPI schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from drf_spectacular.generators import SchemaGenerator

from pilot_status.api_reference import render

PAGE = Path(settings.BASE_DIR) / "docs" / "api.md"


def current_page() -> str:
    schema = SchemaGenerator().get_schema(request=None, public=True)  # type: ignore[no-untyped-call]
    return render(schema)


class Command(BaseCommand):
    help = "Render docs/api.md from the OpenAPI schema (--check: fail when the file is out of date)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="exit 1 when docs/api.md differs from the schema")

    def handle(self, *args: Any, **options: Any) -> None:
        page = current_page()
        if options["check"]:
            if not PAGE.exists() or PAGE.read_text() != page:
                raise CommandError("docs/api.md is out of date with the OpenAPI schema: run `make api-docs`")
            return
        PAGE.write_text(page)
        self.stdout.write(f"wrote {PAGE}")
