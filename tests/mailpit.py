"""Mailpit, the real SMTP server of the e-mail connector's tests: started on free ports with
its own database, and a proxy that loses the answer to an accepted message."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from agentledger import settings
from agentledger.testing import smtp_fault
from agentledger.testing.polling import wait_until
from agentledger.testing.processes import free_port, terminate

__all__ = ["AnswerLost", "Mailpit", "binary", "free_port", "running"]


def binary() -> Path:
    """Built by ``deploy/local/mailpit.sh install`` (bootstrap runs it)."""
    found = Path(os.environ.get("AGENTLEDGER_MAILPIT_BIN")
                 or settings.REPO_ROOT / ".local" / "bin" / "mailpit")
    assert found.is_file(), f"{found} is missing: run bash deploy/local/mailpit.sh install"
    return found


@dataclass(frozen=True)
class Mailpit:
    smtp_port: int
    http_url: str

    def messages(self, message_id: str | None = None) -> list[dict[str, object]]:
        """Every message it holds (or those with this Message-ID), from its API."""
        if message_id is None:
            url = f"{self.http_url}/api/v1/messages?limit=1000"
        else:
            url = (f"{self.http_url}/api/v1/search?"
                   + urllib.parse.urlencode({"query": f"message-id:{message_id}"}))
        answer = httpx.get(url, timeout=5)
        answer.raise_for_status()
        return list(answer.json()["messages"])


@contextmanager
def running(*args: str) -> Iterator[Mailpit]:
    """A Mailpit of its own, stopped and removed after; ``args`` are extra flags."""
    smtp, http = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="al-mailpit-") as home:
        log = open(Path(home) / "mailpit.log", "wb")
        proc = subprocess.Popen(
            [str(binary()), "--smtp", f"127.0.0.1:{smtp}", "--listen", f"127.0.0.1:{http}",
             "--database", str(Path(home) / "mailpit.db"), "--disable-version-check",
             "--smtp-disable-rdns", *args], stdout=log, stderr=subprocess.STDOUT)
        found = Mailpit(smtp, f"http://127.0.0.1:{http}")
        try:
            def ready() -> bool:
                try:
                    found.messages()
                    return True
                except httpx.HTTPError:
                    return False
            assert wait_until(ready, timeout=30), (
                "Mailpit did not answer:\n" + (Path(home) / "mailpit.log").read_text())
            yield found
        finally:
            terminate(proc, grace=10)
            log.close()


class AnswerLost:
    """The demo's SMTP fault proxy (:class:`agentledger.testing.smtp_fault.AnswerLost`), served
    from a thread here: it relays a conversation both ways, except the server's 250 to the
    end of DATA when armed — the message is accepted, its answer lost (once per arming)."""

    def __init__(self, upstream_port: int, *, armed: bool = True) -> None:
        self._proxy = smtp_fault.AnswerLost(0, upstream_port)
        self.port = self._proxy.port
        if armed:
            self._proxy.arm()
        threading.Thread(target=self._proxy.serve_forever, daemon=True).start()

    def arm(self) -> None:
        """Lose the answer of the next message accepted (once)."""
        self._proxy.arm()

    @property
    def dropped(self) -> int:
        """Answers lost after the server accepted the message (the positive marker)."""
        return int(self._proxy.state()["dropped"])

    def close(self) -> None:
        self._proxy.server.close()
