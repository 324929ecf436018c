"""Test helpers: polling with a deadline (never a bare sleep to wait for a condition)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


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


def wait_until(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.2) -> bool:
    """Synchronous poll with a deadline; True once ``predicate()`` holds, False at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True
