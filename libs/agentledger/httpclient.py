"""One pooled keep-alive HTTP client per connector and resolver, on aiohttp.

Measured here (``bench/http_clients.py``: a keep-alive GET, 32 in flight, client CPU only):
httpx about 3 ms of CPU per request, aiohttp about 0.12 ms. Connectors and resolvers sit on
the hot path, once per command each, so they use aiohttp; tools and tests keep httpx.
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole HTTP answer (the body is read before the connection goes back to the pool)."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON.

        Raises:
            ValueError: it is not JSON.
        """
        return jsonlib.loads(self.body)


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
                                        headers=sent) as response:
            return Answer(response.status, response.headers, await response.read())

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
