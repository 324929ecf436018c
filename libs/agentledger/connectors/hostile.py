"""Hostile providers on loopback: an HTTP server and an SMTP server that answer exactly what
they are scripted to (R14, issue 38).

A provider is as untrusted as the model. To check that a connector classifies whatever comes
back, something has to send it what no well-behaved server would: a redirect after a POST, a
body that is not UTF-8, a ``Content-Length`` that lies, JSON of the wrong type, a receipt of
megabytes with NUL characters in it, an answer after the call bound, a connection dropped
after the write — and to know, for each, what the provider actually did (``applies``: the
effect happened before the answer). The conformance kit's ``answers`` claim and the fuzzing
suite drive connectors against these.

Written by hand on asyncio streams rather than on a web framework: a framework refuses to
send most of these answers (a lying length, a malformed status line, half a body).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

# A request head or SMTP line longer than this ends the conversation: the stand-in is for
# answers, not for being attacked itself.
_MAX_HEAD = 64 * 1024
_MAX_BODY = 1 << 20


@dataclass(frozen=True)
class Request:
    """One HTTP request as the hostile provider read it."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class HttpAnswer:
    """What to do with one request. ``raw`` replaces the whole answer with its bytes;
    ``content_length`` lies about the body when given; ``drop`` closes the connection without
    a byte of answer; ``delay_s`` waits before answering; ``applies``: the provider makes the
    request's effect first (what it actually did, whatever it answers)."""

    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    content_length: int | None = None
    delay_s: float = 0.0
    drop: bool = False
    raw: bytes | None = None
    applies: bool = False


Script = Callable[[Request], HttpAnswer]


@dataclass
class HttpProvider:
    """An HTTP/1.1 server on 127.0.0.1 answering each request with ``script(request)``.

    ``requests`` holds every request read, ``applied`` those whose answer applied them.
    """

    script: Script
    requests: list[Request] = field(default_factory=list)
    applied: list[Request] = field(default_factory=list)
    url: str = ""
    _server: asyncio.Server | None = None

    async def start(self) -> HttpProvider:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._answer(reader, writer)
        except asyncio.CancelledError:
            return  # closed while holding an answer back: a stand-in has nothing to clean up

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                self.requests.append(request)
                answer = self.script(request)
                if answer.applies:
                    self.applied.append(request)
                if answer.delay_s:
                    await asyncio.sleep(answer.delay_s)
                if answer.drop:
                    return
                writer.write(answer.raw if answer.raw is not None else _answer_bytes(answer))
                await writer.drain()
                if answer.raw is not None or answer.content_length is not None:
                    return  # what follows a lie is not another answer
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    if len(head) > _MAX_HEAD:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = [*lines[0].split(" ", 2), "", ""][:3]
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length = min(int(headers.get("content-length", "0") or 0), _MAX_BODY)
    body = await reader.readexactly(length) if length else b""
    return Request(method, path, headers, body)


def _answer_bytes(answer: HttpAnswer) -> bytes:
    length = len(answer.body) if answer.content_length is None else answer.content_length
    head = [f"HTTP/1.1 {answer.status} X", f"Content-Length: {length}"]
    head += [f"{name}: {value}" for name, value in answer.headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + answer.body


@contextlib.asynccontextmanager
async def http(script: Script) -> AsyncIterator[HttpProvider]:
    """A started :class:`HttpProvider`, closed on exit."""
    provider = await HttpProvider(script).start()
    try:
        yield provider
    finally:
        await provider.close()


# ---- SMTP -------------------------------------------------------------------------------

SmtpStep = str  # "greeting", "EHLO", "MAIL", "RCPT", "DATA", "END" (the end of the data)


@dataclass(frozen=True)
class SmtpAnswer:
    """What to do at one SMTP conversation's steps: ``codes`` overrides a step's reply code,
    ``drop_at`` closes the connection instead of that step's reply, ``delay_at`` waits
    ``delay_s`` before it; ``accept`` keeps the message at the end of the data (applied),
    before the ``END`` reply is sent or dropped."""

    codes: Mapping[SmtpStep, int] = field(default_factory=dict)
    drop_at: SmtpStep | None = None
    delay_at: SmtpStep | None = None
    delay_s: float = 0.0
    accept: bool = True
    garbage_at: SmtpStep | None = None  # a reply line that is not SMTP


_DEFAULT = {"greeting": 220, "EHLO": 250, "MAIL": 250, "RCPT": 250, "DATA": 354, "END": 250,
            "QUIT": 221, "OTHER": 250}


@dataclass
class SmtpProvider:
    """An SMTP server on 127.0.0.1 following ``script()`` for each connection; ``messages``
    holds the raw messages it accepted (applied)."""

    script: Callable[[], SmtpAnswer]
    messages: list[bytes] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    _server: asyncio.Server | None = None

    async def start(self) -> SmtpProvider:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _reply(self, writer: asyncio.StreamWriter, answer: SmtpAnswer,
                     step: SmtpStep) -> bool:
        """Send ``step``'s reply; False when the script ends the conversation there."""
        if answer.delay_at == step:
            await asyncio.sleep(answer.delay_s)
        if answer.drop_at == step:
            return False
        if answer.garbage_at == step:
            writer.write(b"\xff\xfe ???\r\n")
        else:
            code = answer.codes.get(step, _DEFAULT[step])
            writer.write(f"{code} {step.lower()}\r\n".encode())
        await writer.drain()
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._converse(reader, writer)
        except asyncio.CancelledError:
            return  # closed while holding a reply back

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                        ) -> None:
        answer = self.script()
        try:
            if not await self._reply(writer, answer, "greeting"):
                return
            while True:
                line = await reader.readline()
                if not line or len(line) > _MAX_HEAD:
                    return
                verb = line[:4].decode("latin-1").upper()
                step = {"EHLO": "EHLO", "HELO": "EHLO", "MAIL": "MAIL", "RCPT": "RCPT",
                        "DATA": "DATA", "QUIT": "QUIT"}.get(verb, "OTHER")
                if not await self._reply(writer, answer, step):
                    return
                if step == "QUIT":
                    return
                if step == "DATA" and answer.codes.get("DATA", 354) == 354:
                    data = await reader.readuntil(b"\r\n.\r\n")
                    if answer.accept:
                        self.messages.append(data[:-5])
                    if not await self._reply(writer, answer, "END"):
                        return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def smtp(script: Callable[[], SmtpAnswer]) -> AsyncIterator[SmtpProvider]:
    """A started :class:`SmtpProvider`, closed on exit."""
    provider = await SmtpProvider(script).start()
    try:
        yield provider
    finally:
        await provider.close()
