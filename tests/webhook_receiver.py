"""A webhook receiver of the notification tests: a real HTTP server on a free port, in a
thread, that records every delivery (headers and body) and answers what a test scripts."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def key(self) -> str:
        return self.headers.get("idempotency-key", "")

    def document(self) -> dict[str, Any]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value

    def signed_by(self, secret: bytes) -> bool:
        stamp = self.headers.get("agentledger-timestamp", "")
        mac = hmac.new(secret, stamp.encode() + b"." + self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.headers.get("agentledger-signature", ""), "v1=" + mac)


@dataclass
class Receiver:
    url: str
    deliveries: list[Delivery] = field(default_factory=list)
    # path -> statuses to answer, in order (the last one repeats); unset: 200.
    script: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def seen(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)

    def by_key(self) -> dict[str, list[Delivery]]:
        """What a receiver that dedupes by Idempotency-Key keeps: one entry per key."""
        out: dict[str, list[Delivery]] = {}
        for d in self.seen():
            out.setdefault(d.key, []).append(d)
        return out

    def _status(self, path: str) -> int:
        with self.lock:
            statuses = self.script.get(path)
            if not statuses:
                return 200
            return statuses.pop(0) if len(statuses) > 1 else statuses[0]


@contextmanager
def running() -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 (a free port the OS picks), stopped after."""
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            r = holder[0]
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with r.lock:
                r.deliveries.append(Delivery(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            status = r._status(self.path)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
