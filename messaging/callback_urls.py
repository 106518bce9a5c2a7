"""The check of a send's `callbackUrl` at accept (port, addresses: docs/security.md "Callback bounds").

The guard is the callbacks app's; it registers it here when Django starts (callbacks.apps), so that
messaging imports no callbacks code (docs/architecture.md "Boundaries"). Without it, nothing is checked
here and each attempt still is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_checker: Callable[[str, Any], None] | None = None


def register(checker: Callable[[str, Any], None]) -> None:
    global _checker
    _checker = checker


def check(url: str, project_id: Any) -> None:
    """Raise messaging.errors.Rejected (422) when `url` may not be called for this project."""
    if _checker is not None:
        _checker(url, project_id)
