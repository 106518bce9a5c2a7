"""docs/settings.md is the settings' code rendered (pilot_status.settings_reference): one table, every variable
documented once, and it never disagrees with the code."""

from __future__ import annotations

import re
from pathlib import Path

from pilot_status import settings_reference

ROOT = Path(settings_reference.__file__).resolve().parent.parent


def test_docs_settings_md_is_the_current_settings_rendered() -> None:
    assert settings_reference.PAGE.read_text() == settings_reference.render(), (
        "docs/settings.md is out of date: run `make settings-docs`"
    )


def test_every_setting_says_what_it_does() -> None:
    undocumented = [s.variable for s in settings_reference.settings() if not s.description]
    assert undocumented == [], f"give these a comment above them in the settings: {undocumented}"


def test_every_variable_the_processes_read_is_in_the_table() -> None:
    page = settings_reference.PAGE.read_text()
    read_elsewhere = set(re.findall(r'_period\("([A-Z_]+)"', (ROOT / "pilot_status" / "celery.py").read_text()))
    read_elsewhere |= set(re.findall(r'env\.get\("([A-Z_]+)"\)', (ROOT / "pilot_status" / "lane_worker.py").read_text()))
    assert read_elsewhere, "the patterns still find the variables"
    assert sorted(name for name in read_elsewhere if f"| `{name}` |" not in page) == []


def test_a_settings_module_renders_types_defaults_bounds_and_comments(tmp_path: Path) -> None:
    module = tmp_path / "settings.py"
    module.write_text(
        "# The pace.\n"
        'PACE = envfloat("PACE", 2.5, above=0, at_most=10)\n'
        'BURST = envint("BURST", 3, minimum=1)  # at once\n'
        "OTHER = 1  # not a setting\n"
        'URL = envurl("URL", ("http", "https"))\n'
        'KEY = envsecret("KEY", min_length=32)\n'
    )
    rows = {s.variable: s for s in settings_reference.read(module)}
    assert rows["PACE"] == settings_reference.Setting("PACE", "number", "`2.5`", "> 0, <= 10", "The pace.")
    assert rows["BURST"].description == "The pace. at once"  # the block's comment, and its own
    assert rows["URL"].description == ""  # other code stands between it and the comment
    assert (rows["URL"].default, rows["URL"].bounds) == ("required", "scheme http or https")
    assert (rows["KEY"].kind, rows["KEY"].default, rows["KEY"].bounds) == ("secret", "required", "length >= 32")


def test_the_page_has_a_table_per_settings_module_in_the_package_order() -> None:
    # Every module of the package is imported by its __init__ (so Django sees it and the page documents it),
    # and security comes first: production mode's refusals run before any other variable is read.
    modules = settings_reference.modules()
    assert sorted(path.name for path in modules) == sorted(
        path.name for path in settings_reference.PACKAGE.glob("*.py") if path.name != "__init__.py"
    )
    assert modules[0].name == "security.py"
    page = settings_reference.PAGE.read_text()
    headings = re.findall(r"^## .*\(`(pilot_status/settings/[a-z_]+\.py)`\)$", page, flags=re.MULTILINE)
    assert headings == [str(path.relative_to(ROOT)) for path in modules]


def test_every_variable_is_documented_once() -> None:
    variables = [setting.variable for setting in settings_reference.settings()]
    assert sorted({name for name in variables if variables.count(name) > 1}) == []
