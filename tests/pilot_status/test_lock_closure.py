"""The locks install on every Python the README accepts (3.11.0 and later, on Debian 12, Debian 13 and
Ubuntu 24.04; Linux on x86_64 and aarch64), not only on the Python that compiled them.

`pip install --require-hashes -r <lock>` refuses a requirement the lock does not pin: a lock compiled on one
Python leaves out what only another needs (redis's `async-timeout; python_full_version < "3.11.3"` on a
lock made with 3.11.7 stopped Debian 12's 3.11.2 at `make install`). For each lock and each target, starting
from the pins the lock was made from, every requirement that applies under that target (its marker
evaluated by `packaging` in the target's environment, with the extras asked for) must be pinned in the lock,
at a version its specifier accepts, on a line whose own marker holds there too (pip skips the others).

Where each package's requirements come from: its installed distribution's metadata (Requires-Dist) in the
running venv, which `make install` fills from requirements/dev.lock, a superset of the other two locks at the
same versions. That metadata is the packages' own word, independent of the tool that wrote the lock. A locked
package the running Python does not install (its marker is false here: async-timeout above 3.11.3, colorama
off Windows) has no metadata here; its requirements are then read from the lock's `# via` annotations, which
is all this machine knows of it, and such a package must be one whose marker is false here (anything else
means the venv does not match the lock: `make install`).
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.processes import ROOT

LOCKS = ROOT / "requirements"
# Each lock and the file it is compiled from (`make lock`).
SOURCES = {"runtime.lock": ROOT / "requirements.txt", "simulator.lock": LOCKS / "simulator.in",
           "dev.lock": LOCKS / "dev.in"}
# Debian 12's python3, the last 3.11, Ubuntu 24.04's and Debian 13's: each on both Linux machines.
PYTHONS = ("3.11.2", "3.11.9", "3.12.3", "3.13.5")
MACHINES = ("x86_64", "aarch64")


@dataclass
class Entry:
    version: str
    marker: Marker | None
    via: set[str] = field(default_factory=set)


def read_lock(path: Path) -> dict[str, Entry]:
    """`name==version [; marker]` lines with their `# via` annotations (names only, `-r`/`-c` left out)."""
    entries: dict[str, Entry] = {}
    current: Entry | None = None
    in_via = False
    for line in path.read_text().splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            requirement = Requirement(line.rstrip(" \\"))
            assert len(requirement.specifier) == 1 and next(iter(requirement.specifier)).operator == "==", line
            current = entries[canonicalize_name(requirement.name)] = Entry(
                next(iter(requirement.specifier)).version, requirement.marker)
            in_via = False
            continue
        comment = line.strip().removeprefix("#").strip()
        if current is None or not line.strip().startswith("#"):
            continue
        if comment.startswith("via"):
            in_via = True
            comment = comment.removeprefix("via").strip()
        if in_via and comment and not comment.startswith(("-r ", "-c ")):
            current.via.add(canonicalize_name(comment.split()[0]))
    return entries


def source_requirements(path: Path) -> list[Requirement]:
    """The pins a lock is made from, following `-r` (a `-c` constrains, it asks for nothing)."""
    found: list[Requirement] = []
    for line in path.read_text().splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith(("#", "-c")):
            continue
        if line.startswith("-r"):
            found += source_requirements((path.parent / line.removeprefix("-r").strip()).resolve())
        else:
            found.append(Requirement(line))
    return found


def target_environment(python: str, machine: str) -> dict[str, str]:
    environment = dict(default_environment())
    environment.update(python_version=".".join(python.split(".")[:2]), python_full_version=python,
                       implementation_name="cpython", implementation_version=python,
                       platform_python_implementation="CPython", platform_machine=machine,
                       platform_system="Linux", sys_platform="linux", os_name="posix")
    return environment


def applies(marker: Marker | None, environment: dict[str, str], extras: frozenset[str] = frozenset()) -> bool:
    return marker is None or any(marker.evaluate({**environment, "extra": extra}) for extra in {"", *extras})


def requirements_of(name: str, entry: Entry, lock: dict[str, Entry]) -> list[Requirement]:
    """What the locked package `name` asks for: its installed metadata, else the lock's annotations (only for a
    package whose marker is false on the running Python)."""
    try:
        distribution = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        assert not applies(entry.marker, dict(default_environment())), (
            f"{name}=={entry.version} applies on this Python but is not installed: the venv does not match "
            "the lock (make install)")
        return [Requirement(child) for child, other in lock.items() if name in other.via]
    assert distribution.version == entry.version, (
        f"{name}: {distribution.version} installed, {entry.version} locked (make install)")
    return [Requirement(text) for text in distribution.requires or []]


def unpinned(lock_name: str, python: str, machine: str) -> list[str]:
    """Every requirement that applies under the target and that the lock does not satisfy there."""
    lock = read_lock(LOCKS / lock_name)
    environment = target_environment(python, machine)
    problems: list[str] = []
    pending = [("(" + SOURCES[lock_name].name + ")", requirement) for requirement in source_requirements(SOURCES[lock_name])]
    expanded: set[tuple[str, frozenset[str]]] = set()
    while pending:
        parent, requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        entry = lock.get(name)
        if entry is None:
            problems.append(f"{parent} needs {requirement}: not in the lock")
            continue
        if not applies(entry.marker, environment):
            problems.append(f"{parent} needs {requirement}: the lock pins it only where {entry.marker}")
            continue
        if not requirement.specifier.contains(entry.version, prereleases=True):
            problems.append(f"{parent} needs {requirement}: the lock pins {entry.version}")
            continue
        key = (name, frozenset(canonicalize_name(extra) for extra in requirement.extras))
        if key in expanded:
            continue
        expanded.add(key)
        for child in requirements_of(name, entry, lock):
            if applies(child.marker, environment, key[1]):
                pending.append((f"{name}=={entry.version}", child))
    return sorted(set(problems))


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("lock_name", sorted(SOURCES))
def test_every_requirement_that_applies_under_each_python_is_pinned_in_the_lock(lock_name, python, machine):
    problems = unpinned(lock_name, python, machine)
    assert not problems, f"{lock_name} under Python {python} on {machine}: " + "; ".join(problems)


def test_the_closure_sees_markers_extras_and_the_annotations():
    # async-timeout applies to redis below 3.11.3 only; psycopg's binary extra brings psycopg-binary.
    marker = Requirement('async-timeout>=4.0.3; python_full_version < "3.11.3"').marker
    assert applies(marker, target_environment("3.11.2", "x86_64"))
    assert not applies(marker, target_environment("3.11.9", "aarch64"))
    extra = Requirement('psycopg-binary==3.3.9; implementation_name != "pypy" and extra == "binary"').marker
    assert applies(extra, target_environment("3.13.5", "x86_64"), frozenset({"binary"}))
    assert not applies(extra, target_environment("3.13.5", "x86_64"))
    lock = read_lock(LOCKS / "runtime.lock")
    assert {"django", "django-axes"} <= lock["asgiref"].via and lock["django"].version
    assert any(requirement.name == "psycopg" and requirement.extras == {"binary"}
               for requirement in source_requirements(SOURCES["dev.lock"]))
