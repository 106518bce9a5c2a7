from __future__ import annotations

from collections.abc import Iterator

import pytest

from ingestion import auth


@pytest.fixture(autouse=True)
def _fresh_auth_cache() -> Iterator[None]:
    # Each test's database starts over; an instance cached by an earlier test must not outlive it.
    auth.forget_cached_instances()
    yield
    auth.forget_cached_instances()
