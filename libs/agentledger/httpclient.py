"""One pooled keep-alive HTTP client per connector and resolver, on aiohttp.

Measured here (``bench/http_clients.py``: a keep-alive GET, 32 in flight, client CPU only):
httpx about 3 ms of CPU per request, aiohttp about 0.12 ms. Connectors and resolvers sit on
the hot path, once per command each, so they use aiohttp; tools and tests keep httpx.

What comes back is a provider's, so untrusted (R14): redirects are never followed (aiohttp
would replay a POST and its credential headers to wherever ``Location`` points, and the
follow-up's answer would pass for the write's), a body is read up to ``MAX_BODY`` bytes and
marked ``truncated`` past it, and a templated path segment is refused when it is a dot
segment the URL library would resolve into another route (``segment``).
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

# The most of an answer's body kept: receipts and error codes are small; a provider that
# sends more is not answering the question (and cannot make a worker hold gigabytes).
MAX_BODY = 1 << 20


def segment(value: str) -> str:
    """``value`` as one URL path segment: percent-encoded, never a dot segment.

    Raises:
        ValueError: ``value`` is empty, ``.`` or ``..`` (it would name another route).
    """
    if value in ("", ".", ".."):
        raise ValueError(f"{value!r} cannot be a path segment: it would name another route")
    return quote(value, safe="")


async def read_body(response: aiohttp.ClientResponse, limit: int = MAX_BODY
                    ) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the body, and whether there was more."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], True
    return b"".join(chunks), False


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole HTTP answer (the body is read before the connection goes back to the pool)."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    truncated: bool = False  # the body went past MAX_BODY: only its start is here

    def json(self) -> Any:
        """The body as JSON.

        Raises:
            ValueError: it is not JSON (or not UTF-8, or truncated).
        """
        if self.truncated:
            raise ValueError("the body was longer than the client reads")
        return jsonlib.loads(self.body)

    def json_object(self) -> dict[str, Any] | None:
        """The body as a JSON object, or None when it is anything else (never raises)."""
        try:
            found = self.json()
        except (ValueError, RecursionError):
            return None
        return found if isinstance(found, dict) else None


class Client:
    """A base URL and one keep-alive session, opened on first use inside the running loop."""

    def __init__(self, base_url: str, *, timeout: aiohttp.ClientTimeout,
                 max_connections: int = 100) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout, self._limit = timeout, max_connections
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._limit, ttl_dns_cache=300),
                # The services never read cookies; a jar would only cost CPU per request.
                cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def request(self, method: str, path: str, *, headers: Mapping[str, str],
                      json: Mapping[str, Any] | None = None) -> Answer:
        """Send one request and read the whole answer.

        Raises:
            aiohttp.ClientConnectorError: no connection was made (nothing was sent).
            aiohttp.ClientError, TimeoutError: anything else: the request may have arrived.
        """
        body = None if json is None else jsonlib.dumps(dict(json)).encode()
        sent = dict(headers)
        if body is not None:
            sent["Content-Type"] = "application/json"
        async with self._open().request(method, self.base_url + path, data=body,
                                        headers=sent, allow_redirects=False) as response:
            content, truncated = await read_body(response)
            return Answer(response.status, response.headers, content, truncated)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
