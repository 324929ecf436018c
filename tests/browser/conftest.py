"""Browser tier: Playwright driving Debian's Chromium against the whole pipeline as processes.

Chromium is the system package (``apt-get install chromium``), never a downloaded build.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

from agentledger.testing.pipeline import Pipeline, pipeline
from tests.stack import Stack

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# Every expectation polls; a page that needs longer than this is broken, not slow.
PAGE_TIMEOUT_MS = 15_000


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/browser/" in str(item.path):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("browser"), console=True) as p:
        yield p


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    b = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def sign_in(world: Pipeline, browser: Browser) -> Iterator[Callable[..., Page]]:
    """Factory: a fresh browser context signed in to the console as ``principal``."""
    contexts: list[Any] = []

    def open_as(principal: str, roles: list[str], tenant: str | None = None) -> Page:
        assert world.console_url and world.sessions
        context = browser.new_context(base_url=world.console_url,
                                      viewport={"width": 1200, "height": 900})
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        contexts.append(context)
        page = context.new_page()
        page.goto("/signin")
        page.fill("#token", world.sessions.issue(tenant or world.tenant, principal, roles))
        page.click("button[type=submit]")
        page.wait_for_url("**/approvals")
        return page

    yield open_as
    for context in contexts:
        context.close()
