"""Waiting for a condition with a deadline, the only way tests, bench and demo wait."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.2) -> bool:
    """Synchronous poll with a deadline; True once ``predicate()`` holds, False at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True
