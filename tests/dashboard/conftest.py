"""Browser fixtures: Debian's chromium driven by Playwright, and the worker of bulk jobs.

Playwright cannot download its own browser on this machine; `make test` installs chromium
(`make browser-deps`) and the tests launch it by path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pilot_status import topology
from tests.support.processes import ROOT, Process, wait_for_log

CHROMIUM = os.environ.get("PS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    # Playwright's sync API runs an event loop between calls; the ORM refuses to run inside one
    # unless told that this (single-threaded test) use is safe.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_page(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1280, "height": 860}, device_scale_factor=1)
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        context.close()


@pytest.fixture(scope="session")
def maintenance_worker(stack_process: Any) -> Iterator[Process]:
    """The Celery worker of the `bulk` queue (bulk resend jobs), on the test database."""
    # Its own node name and log: the beat test's stack starts a `bulk@test` of its own while this
    # session-scoped worker still runs, and two workers of one name cannot share a pidbox queue.
    argv = topology.process("worker_bulk").command(topology.stack_site(0, node="dashboard-test"))
    worker = Process("worker-bulk-dashboard", argv, stack_process.env).start()
    wait_for_log(worker.log, "ready.", proc=worker.proc)
    try:
        yield worker
    finally:
        worker.stop()


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
