"""``python -m agentledger.testing.smtp_fault``: an SMTP path to Mailpit, able to lose one
answer after the message was accepted.

It relays each SMTP conversation both ways, byte for byte. When armed, it waits for the
server's answer to the end of ``DATA``; if that answer is ``250`` (the message is accepted,
the effect has happened) it drops the client connection instead of relaying it, once. The
executor then cannot know whether the message went out: the lost answer of the e-mail story.

A small HTTP control port arms it and says what it did (``POST /arm``, ``GET /healthz``:
``{"armed": …, "dropped": …}``), the way the CRM stand-in's fault API arms a lost answer.
The demo runs it as a process of its own because the e-mail executor keeps using it after
the demo's command has ended; the e-mail tests serve it from a thread (``tests/mailpit.py``).

Environment: ``AGENTLEDGER_DEMO_SMTP_PORT`` (where it listens),
``AGENTLEDGER_DEMO_SMTP_UPSTREAM_PORT`` (Mailpit's SMTP port on 127.0.0.1),
``AGENTLEDGER_DEMO_SMTP_CONTROL_PORT`` (the HTTP control port).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

END_OF_DATA = b"\r\n.\r\n"


class AnswerLost:
    """Relays SMTP to ``upstream_port``; loses the answer to one accepted message when armed."""

    def __init__(self, port: int, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.server = socket.create_server(("127.0.0.1", port))
        self.port = int(self.server.getsockname()[1])
        self.lock = threading.Lock()
        self.armed = False
        self.dropped = 0  # answers lost after the server accepted the message

    def arm(self) -> None:
        with self.lock:
            self.armed = True

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"armed": self.armed, "dropped": self.dropped}

    def serve_forever(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _take_drop(self) -> bool:
        with self.lock:
            if not self.armed:
                return False
            self.armed = False
            self.dropped += 1
            return True

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        ended = threading.Event()  # the client sent the end of DATA

        def client_to_server() -> None:
            tail = b""
            try:
                while chunk := client.recv(65536):
                    tail = (tail + chunk)[-len(END_OF_DATA):]
                    if tail.endswith(END_OF_DATA):
                        ended.set()  # before it is sent: the answer cannot come first
                    upstream.sendall(chunk)
            except OSError:
                pass

        threading.Thread(target=client_to_server, daemon=True).start()
        try:
            while chunk := upstream.recv(65536):
                if ended.is_set() and chunk.startswith(b"250") and self._take_drop():
                    print("event=smtp_answer_dropped", flush=True)
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


def _control(proxy: AnswerLost) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, proxy.state())
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            if self.path == "/arm":
                proxy.arm()
                print("event=smtp_fault_armed", flush=True)
                self._send(200, proxy.state())
            else:
                self._send(404, {"error": "not found"})

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the events above are the log

    return Handler


def main() -> None:
    proxy = AnswerLost(int(os.environ["AGENTLEDGER_DEMO_SMTP_PORT"]),
                       int(os.environ["AGENTLEDGER_DEMO_SMTP_UPSTREAM_PORT"]))
    control = ThreadingHTTPServer(
        ("127.0.0.1", int(os.environ["AGENTLEDGER_DEMO_SMTP_CONTROL_PORT"])), _control(proxy))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    print(f"event=smtp_fault_started port={proxy.port} upstream={proxy.upstream}", flush=True)
    try:
        control.serve_forever()
    except KeyboardInterrupt:  # pragma: no cover - interactive use
        pass


if __name__ == "__main__":
    main()
