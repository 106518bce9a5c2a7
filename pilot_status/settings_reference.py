"""docs/settings.md, the table of every environment variable the product reads, made from the settings' code.

Each setting is read in a module of the settings package (pilot_status/settings/: one module per concern, in
the order its __init__ imports them) through pilot_status.envparse (`envint("NAME", default, ...)`) with the
comment above it saying what it does; this module reads those modules' source (it imports nothing, so a
setting that fails start-up still gets documented) and renders one table per module, one row per variable:
its type, default, bounds and the comment. A setting with no comment of its own shares the comment of the
block it sits in. So the docs and the code cannot disagree: `manage.py settings_reference` writes the page,
`--check` says whether it is current (tests/pilot_status/test_settings_reference.py), and a variable without
a comment fails that test.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "settings.md"

PACKAGE = ROOT / "pilot_status" / "settings"


def modules() -> list[Path]:
    """The settings package's modules in the order its __init__ imports them (`from .name import *`): the
    page's order, so a module added to the package is documented once it is imported."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    return [
        PACKAGE / f"{statement.module}.py" for statement in tree.body
        if isinstance(statement, ast.ImportFrom) and statement.level == 1 and statement.module
        and [alias.name for alias in statement.names] == ["*"]
    ]


def concern(path: Path) -> tuple[str, str]:
    """A module's section title and lead: its docstring's words before the first colon, and the rest of its
    first paragraph."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or path.stem
    paragraph = " ".join(docstring.split("\n\n", 1)[0].split())
    title, _, lead = paragraph.partition(": ")
    return title, lead


# What each envparse reader takes: the variable's type as the page shows it, and the keyword bounds it checks.
READERS = {
    "envstr": "string",
    "envsecret": "secret",
    "envbool": "boolean",
    "envint": "integer",
    "envfloat": "number",
    "envurl": "URL",
    "envpair": "header, value",
    "envwaits": "seconds, comma-separated",
    "envfernetkeys": "Fernet keys, comma-separated",
    "envproxies": "count or networks",
    "envports": "ports, comma-separated",
}
BOUNDS = {"minimum": ">=", "above": ">", "at_most": "<=", "min_length": "length >="}

# Variables read where the processes start rather than in the settings (pilot_status.lane_worker, gunicorn,
# manage.py): they choose how a process runs, not what the product does.
PROCESS_VARIABLES: tuple[tuple[str, str, str, str], ...] = (
    ("LANE_WORKER_POOL", "string", "`threads`",
     "The Celery pool of the lane workers (pilot_status.lane_worker): `threads` or `prefork`."),
    ("LANE_WORKER_CONCURRENCY", "integer", "per lane",
     "Threads (or processes) of every lane worker; `LANE_WORKER_CONCURRENCY_OTP`, `_UTILITY` and `_MARKETING` set one lane's."),
    ("LANE_WORKER_DB_CONNECTIONS", "integer", "per pool",
     "Database connections a threads-pool lane worker shares among its threads (sets DATABASE_POOL_MAX_SIZE for it)."),
    ("PROMETHEUS_MULTIPROC_DIR", "path", "unset",
     "A directory every process of one deployment writes its metrics into, so that /metrics merges them "
     "(prometheus_client's multiprocess mode); unset, each process serves only its own."),
    ("PILOT_TEST_STACK", "boolean", "unset",
     "Set by the test, bench and chaos stacks only (receivers on loopback): production mode then lets "
     "CALLBACKS_ALLOW_PRIVATE_ADDRESSES through (pilot_status.production). A deployment never sets it."),
    ("NAME_FILE", "path", "unset",
     "For any variable NAME above: read its value from this file instead (docker and Kubernetes secrets)."),
)


@dataclass(frozen=True)
class Setting:
    variable: str
    kind: str
    default: str
    bounds: str
    description: str


def read(path: Path) -> list[Setting]:
    """The settings one module reads, in the order it reads them (a variable read twice: its first reading)."""
    source = path.read_text()
    lines = source.splitlines()
    statements = ast.parse(source).body
    # Line (0-based) -> whether the top-level statement covering it reads a variable: a setting without a
    # comment of its own shares the comment of the settings right above it, never of other code.
    reads_a_variable: dict[int, bool] = {}
    for statement in statements:
        for row in range(statement.lineno - 1, (statement.end_lineno or statement.lineno)):
            reads_a_variable[row] = bool(_calls(statement))
    found: dict[str, Setting] = {}
    for statement in statements:
        for call in _calls(statement):
            name = call.args[0].value  # type: ignore[attr-defined]
            if name not in found:
                description = _comment(lines, statement, reads_a_variable)
                found[name] = Setting(name, READERS[call.func.id], _default(call), _bounds(call), description)  # type: ignore[attr-defined]
    return list(found.values())


def _calls(statement: ast.stmt) -> list[ast.Call]:
    return [
        node for node in ast.walk(statement)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in READERS
        and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    ]


def _default(call: ast.Call) -> str:
    reader = call.func.id  # type: ignore[attr-defined]
    position = 2 if reader == "envurl" else 1  # envurl(name, schemes, default)
    value: ast.expr | None = call.args[position] if len(call.args) > position else None
    for keyword in call.keywords:
        if keyword.arg == "default":
            value = keyword.value
    if reader in ("envpair", "envfernetkeys", "envproxies", "envports"):
        return "unset"
    if value is None or reader == "envsecret":
        return "required"
    if isinstance(value, ast.Constant):
        return f"`{value.value!r}`" if isinstance(value.value, str) else f"`{value.value!s}`"
    return f"`{ast.unparse(value)}`"


def _bounds(call: ast.Call) -> str:
    parts = []
    if call.func.id == "envurl" and len(call.args) > 1:  # type: ignore[attr-defined]
        parts.append("scheme " + " or ".join(ast.literal_eval(call.args[1])))
    for keyword in call.keywords:
        if keyword.arg in BOUNDS:
            parts.append(f"{BOUNDS[keyword.arg]} {ast.unparse(keyword.value)}")
    return ", ".join(parts)


def _comment(lines: list[str], statement: ast.stmt, reads_a_variable: dict[int, bool]) -> str:
    """The comment lines right above the statement (or above the settings it directly follows, with no blank
    line between), and a comment at the end of its first line."""
    first = statement.lineno - 1
    inline = lines[first].split("  # ", 1)[1].strip() if "  # " in lines[first] else ""
    row = first - 1
    while row >= 0 and lines[row].strip() and not lines[row].lstrip().startswith("#") and reads_a_variable.get(row, True):
        row -= 1  # an earlier setting of the same block
    above: list[str] = []
    while row >= 0 and lines[row].lstrip().startswith("#"):
        above.insert(0, lines[row].strip().lstrip("#").strip())
        row -= 1
    return " ".join(part for part in (" ".join(above), inline) if part)


def render() -> str:
    out = [
        "# Settings",
        "",
        "<!-- Generated from the settings' code by `make settings-docs` (manage.py settings_reference): do not edit by hand. -->",
        "",
        "Every setting is an environment variable. A value in the environment wins over `.env`, which wins over the",
        "development defaults in `scripts/env.sh` (`make run`, `make test`); the defaults below are the product's own,",
        "which a deployment gets. A value outside its bounds, or a required one missing, stops every process at start",
        "with the variable's name. With `DEBUG=0` (production mode) weak or published secrets are refused as well",
        "(docs/security.md).",
        "",
    ]
    for path in modules():
        title, lead = concern(path)
        out += [f"## {title} (`{path.relative_to(ROOT)}`)", "", f"{lead[:1].upper()}{lead[1:]}", ""]
        out += ["| variable | type | default | bounds | what it does |", "|---|---|---|---|---|"]
        for setting in read(path):
            out.append(
                f"| `{setting.variable}` | {setting.kind} | {_cell(setting.default)} | {_cell(setting.bounds)} | {_cell(setting.description)} |"
            )
        out.append("")
    out += ["## Process settings", "", "| variable | type | default | what it does |", "|---|---|---|---|"]
    out += [f"| `{name}` | {kind} | {default} | {_cell(text)} |" for name, kind, default, text in PROCESS_VARIABLES]
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings() -> list[Setting]:
    return [setting for path in modules() for setting in read(path)]
