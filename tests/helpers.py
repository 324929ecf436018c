"""Test helpers: async polling with a deadline (never a bare sleep to wait for a condition;
the synchronous poll is :func:`agentledger.testing.polling.wait_until`), a stand-in API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")
# A counter's points by label set, as the ``recorded`` fixture reads them:
# ``{(("connector", "crm"),): 1}``.
Points = Callable[[], dict[tuple[tuple[str, Any], ...], int | float]]


async def assert_eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    message: str = "condition not met",
) -> T:
    """Poll ``probe`` until it returns a truthy value (returned) or raises no AssertionError.

    Raises the probe's last AssertionError, or an AssertionError with ``message``, once
    ``timeout`` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    last: AssertionError | None = None
    while True:
        try:
            value = await probe()
            if value:
                return value
            last = AssertionError(f"{message} (probe returned {value!r})")
        except AssertionError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise last
        await asyncio.sleep(interval)


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve a small aiohttp app on a free local port (a test's stand-in API); its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
