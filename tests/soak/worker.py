"""The soak's background parts (load, approver, observers, fault scheduler): a daemon thread
each, stopped through an event."""

from __future__ import annotations

import threading


class Worker:
    """Runs ``_run`` on a daemon thread named ``name``; ``_run`` returns once ``_stop`` is set."""

    join_s = 60.0  # how long ``stop`` waits for the thread, unless told

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._thread.join(timeout=self.join_s if timeout is None else timeout)

    def alive(self) -> bool:
        return self._thread.is_alive()
