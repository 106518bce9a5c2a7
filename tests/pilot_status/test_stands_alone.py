"""The repository stands alone: no tracked file points at a document that is not in it.

The design principles are docs/architecture.md's (cite "principle N"), the API is docs/api.md, Evolution's
interface as the product uses it is docs/evolution-setup.md. A clone holds nothing else to follow, so a
citation of a planning document outside the repository (its file names, or their sections by number) is
a dead end for the reader.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Written so that this file does not match itself: the dots are escaped, the slash is a class.
OUTSIDE = re.compile(
    r"shared[/]spec"
    r"|\b(?:design|contract|seeds|services|style)\.md\b"
    r"|\bevolution-api\.md\b"
    r"|\b(?:contract|design)\.? ?§"
    r"|\bseeds(?:\.md)? [A-D]\b"
)


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.split("\0") if name]


def citations(text: str) -> list[str]:
    return [match.group(0) for match in OUTSIDE.finditer(text)]


def test_the_pattern_finds_each_kind_of_outside_citation():
    cited = "\n".join([
        "see /work/shared" + "/spec/evolution-samples",
        "(design" + ".md §3)", "(contract" + " §7)", "contract" + ".md", "(seeds" + " B)", "seeds" + ".md A",
        "services" + ".md", "evolution-api" + ".md §8", "design" + " §5",
    ])
    assert len(citations(cited)) == 9
    assert citations("docs/architecture.md, principle 3; docs/api.md; evolution-api #1938; tests/simulator/samples") == []


def test_no_tracked_file_cites_a_document_outside_the_repository():
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # images and other binary files
        for number, line in enumerate(text.splitlines(), 1):
            for cited in citations(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {cited}")
    assert found == [], "cite docs/architecture.md's principles or the docs/ page instead:\n" + "\n".join(found)


def test_no_run_state_is_tracked_and_pid_files_are_ignored():
    assert [path.name for path in tracked_files() if path.suffix == ".pid"] == []
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "before.pid", "scripts/x.pid"], capture_output=True, text=True,
                             cwd=ROOT)
    assert ignored.stdout.split() == ["before.pid", "scripts/x.pid"], ".gitignore must cover *.pid"
