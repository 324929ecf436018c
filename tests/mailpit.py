"""Mailpit, the real SMTP server of the e-mail connector's tests: started on free ports with
its own database, and a proxy that loses the answer to an accepted message."""

from __future__ import annotations

import os
import socket
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
from tests.helpers import wait_until
from tests.integration.processes import free_port

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
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            log.close()


class AnswerLost:
    """An SMTP proxy that relays a conversation both ways, except the server's answer to the
    end of DATA: it waits for that answer (the message is then accepted) and drops the client
    connection instead of relaying it — the lost answer, after the effect.

    Hand-written: no proxy library lets a test cut a TCP stream at one SMTP reply, and this is
    a few dozen lines over sockets and threads.
    """

    def __init__(self, upstream_port: int, *, armed: bool = True) -> None:
        self.upstream = upstream_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.dropped = threading.Event()  # positive marker: an accepted answer was lost
        self.armed = armed
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        """Lose the answer of the next message accepted (once)."""
        self.dropped.clear()
        self.armed = True

    def close(self) -> None:
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream))
        ended = threading.Event()  # the client sent the end of DATA

        def client_to_server() -> None:
            tail = b""
            try:
                while chunk := client.recv(65536):
                    tail = (tail + chunk)[-5:]
                    if tail.endswith(b"\r\n.\r\n"):
                        ended.set()  # before it is sent: the answer cannot come first
                    upstream.sendall(chunk)
            except OSError:
                pass

        threading.Thread(target=client_to_server, daemon=True).start()
        try:
            while chunk := upstream.recv(65536):
                if ended.is_set() and self.armed and chunk.startswith(b"250"):
                    self.armed = False
                    self.dropped.set()
                    break  # accepted upstream; the client never hears it
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
