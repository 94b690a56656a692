"""Dashboard fixtures: a signed-in in-process client, and for the browser tests a real
det-master with a real agent driven by Playwright through Debian's Chromium."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from tests.conftest import require

COOKIE = "resolute_session"
CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF token in the page"
    return match.group(1)


@pytest_asyncio.fixture
async def web(anon: httpx.AsyncClient) -> httpx.AsyncClient:
    """The in-process client signed in through the sign-in form, as a browser would be."""
    reply = await anon.post(
        "/ui/login",
        data={"username": "determined", "password": "", "next": "/ui/cluster"},
        headers={"Origin": "http://master"},
    )
    assert reply.status_code == 303, reply.text
    assert COOKIE in anon.cookies
    return anon


async def web_csrf(client: httpx.AsyncClient) -> str:
    page = await client.get("/ui/templates")
    assert page.status_code == 200, page.text
    return csrf_of(page.text)


# -- the browser ---------------------------------------------------------------------------


def chromium_path() -> str:
    path = shutil.which("chromium")
    require(
        path is not None,
        "Debian's chromium is not installed (make test installs it: apt-get install chromium)",
    )
    assert path is not None
    return path


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def screenshot_dir() -> Path:
    """$RESOLUTE_SCREENSHOTS, else test-artifacts/ui-screenshots (git ignores it)."""
    configured = os.environ.get("RESOLUTE_SCREENSHOTS")
    path = Path(configured) if configured else ROOT / "test-artifacts" / "ui-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    print(f"\ndashboard screenshots: {path}")
    return path


@dataclass
class ConsoleLog:
    """Console errors and uncaught exceptions of every page a test opened."""

    errors: list[str] = field(default_factory=list)

    def watch(self, page: Any) -> None:
        def on_console(message: Any) -> None:
            if message.type == "error":
                self.errors.append(f"{page.url}: console: {message.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda exc: self.errors.append(f"{page.url}: uncaught: {exc}"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "playwright is not installed (it is in the test dependency group)")
        raise
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            args=["--disable-background-networking", "--no-sandbox"],
        )
        try:
            yield instance
        finally:
            instance.close()
