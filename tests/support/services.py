"""Really stop and start the shared servers (scripts/services.sh), for fault tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from .processes import ROOT


def service(action: str, name: str) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "services.sh"), action, name],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        timeout=180,
    )


@contextmanager
def stopped(*names: str) -> Iterator[None]:
    """Stop the named services for the duration of the block; always start them again."""
    try:
        for name in names:
            service("stop", name)
        yield
    finally:
        for name in names:
            service("start", name)
