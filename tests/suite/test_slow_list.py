"""The `slow` list (tests/support/slow.py) names tests that exist, and `-m "not slow"` leaves exactly them out."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.support.slow import SLOW

ROOT = Path(__file__).resolve().parents[2]


def defined_tests(path: Path) -> set[str]:
    """The module's test functions, and its test classes' methods as `Class::method`."""
    tree = ast.parse(path.read_text())
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{item.name}" for item in node.body if isinstance(item, ast.FunctionDef)}
    return names


def test_every_listed_slow_test_exists():
    missing = [f"{path}::{name}" for path, names in SLOW.items() for name in names
               if not (ROOT / path).is_file() or name not in defined_tests(ROOT / path)]
    assert missing == [], "tests/support/slow.py names tests that are gone (renamed?):\n" + "\n".join(missing)


def test_not_slow_leaves_out_the_listed_tests_with_all_their_parameters():
    path = "tests/pilot_status/test_production_mode.py"
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                                "-m", "slow", path], cwd=ROOT, capture_output=True, text=True, timeout=120)
    chosen = {line.split("::", 1)[1].split("[", 1)[0] for line in collected.stdout.splitlines() if "::" in line}
    assert chosen == set(SLOW[path]), collected.stdout[-2000:]
