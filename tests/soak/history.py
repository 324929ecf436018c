"""The soak's history: every request it sent and every observation it made, one JSON object a
line, appended as they happen (reports/soak/history.jsonl).

Each record has ``t`` (seconds since the soak began, monotonic), ``at`` (wall clock, UTC) and
``kind``. Requests: ``proposal`` (the operation id, action and the arguments' key facts, when
sent and whether the broker acknowledged it), ``decision`` (an approval or a denial and what
it answered). Observations: ``state`` (a change of a command's state seen by polling the
ledger), ``admission`` and ``audit`` (records seen on those topics), ``slot`` (the relay's
confirmed position against the outbox rows still owed), ``fault`` (inject, struck, heal,
healed), ``service_exit`` (a service that died on its own and was restarted), ``phase``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class History:
    """Append-only and thread-safe: the load, the approver, the observers and the fault
    scheduler all write to it. A line is flushed as written, so an interrupted run keeps
    everything up to the interruption."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("w", encoding="utf-8")
        self._lock = threading.Lock()
        self._began = time.monotonic()

    def now(self) -> float:
        """Seconds since the soak began (the ``t`` of the records)."""
        return time.monotonic() - self._began

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"t": round(self.now(), 3), "at": datetime.now(UTC).isoformat(), "kind": kind,
                  **fields}
        line = json.dumps(record, default=str, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
        return record

    def close(self) -> None:
        with self._lock:
            self._file.close()


def load(path: Path) -> list[dict[str, Any]]:
    """Every record of a history file, in the order written."""
    return list(records(path))


def records(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
