"""Resolve targets through the CRM's read API with a READ-only, per-tenant token (R1.4, R1.7).

The resolver plugin: single reads (retrieval, the console) go through
:class:`agentledger.resources.crm_client.CrmReader`; this batches admission's revision checks
on the hot path, over the same token table and bearer header.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

import aiohttp

from agentledger import errors, httpclient
from agentledger.connectors import plugins
from agentledger.resources import Resource, crm_client, not_found

# A resolution is one indexed read; past this the CRM is unwell and admission should retry
# the proposal later rather than hold its consumer.
TIMEOUT_S = 5.0



# Ids per read of many (the CRM's bound on ``GET /v1/customers?id=…``).
MAX_BATCH = 100


class CrmResolver:
    """Looks customers up in the CRM, in the proposal's tenant only.

    Resolutions of one tenant asked at the same moment (the proposals of one Kafka batch,
    checked concurrently) share one read: ``GET /v1/customers?id=a&id=b``, which answers the
    current revision of each id found. Every resolution is still a read made after it was
    asked — nothing is cached, so a revision that changes is never hidden (R1.4). A lone
    resolution is a read of one id, sent at once.
    """

    def __init__(self, base_url: str, read_tokens: Mapping[str, str]) -> None:
        """Args:
            base_url: the CRM's URL.
            read_tokens: tenant id → a token with only the ``read`` scope for that tenant.
        """
        self._tokens = dict(read_tokens)
        self._client = httpclient.Client(base_url,
                                         timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
        # Per tenant: the ids asked since the last read was sent, each with its waiters.
        self._asked: dict[str, dict[str, list[asyncio.Future[str | None]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.reads = 0  # reads sent (for tests and the benchmark)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def resolve(self, tenant_id: UUID, connector: str, resource_id: str) -> Resource:
        token = self._tokens.get(str(tenant_id))
        if token is None:
            raise not_found(resource_id)  # a tenant we hold no scope for has no resources
        tenant = str(tenant_id)
        asked = self._asked.get(tenant)
        if asked is None:
            # The first of this moment: the read goes once the loop has let every resolution
            # asked along with it join (the tasks already ready run first).
            asked = self._asked[tenant] = {}
            task = asyncio.create_task(self._read(tenant, token))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        waiter: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        asked.setdefault(resource_id, []).append(waiter)
        revision = await waiter
        if revision is None:
            raise not_found(resource_id)
        return Resource(connector, resource_id, revision)

    async def _read(self, tenant: str, token: str) -> None:
        asked = self._asked.pop(tenant)
        try:
            await self._answer(asked, token)
        finally:
            # Whatever happened (a bug, a cancelled task at shutdown), nobody waits forever.
            for waiters in asked.values():
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(errors.StorageError("the resolution was aborted"))

    async def _answer(self, asked: dict[str, list[asyncio.Future[str | None]]],
                      token: str) -> None:
        ids = list(asked)
        for start in range(0, len(ids), MAX_BATCH):
            chunk = ids[start:start + MAX_BATCH]
            try:
                found = await self._revisions(token, chunk)
            except Exception as exc:  # every waiter of the chunk gets the read's error
                for resource_id in chunk:
                    for waiter in asked[resource_id]:
                        if not waiter.done():
                            waiter.set_exception(exc)
                continue
            for resource_id in chunk:
                revision = found.get(resource_id)
                for waiter in asked[resource_id]:
                    if not waiter.done():
                        waiter.set_result(None if revision is None else str(revision))

    async def _revisions(self, token: str, ids: list[str]) -> dict[str, int]:
        """The current revision of each id the tenant has (absent: not found).

        Raises:
            StorageError: the CRM is unreachable or failing (retryable).
            IdentityRejected: the CRM refused the read token.
        """
        self.reads += 1
        try:
            response = await self._client.request(
                "GET", f"/v1/customers?{urlencode([('id', i) for i in ids])}",
                headers=crm_client.auth_header(token))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise errors.StorageError(f"CRM unreachable while resolving: {exc!r}") from exc
        if response.status == 422:
            # An id the CRM cannot hold (its alphabet) names no customer; the others are
            # asked again one by one so one such id never hides another's answer.
            if len(ids) == 1:
                return {}
            found: dict[str, int] = {}
            for one in ids:
                found.update(await self._revisions(token, [one]))
            return found
        if response.status >= 500:
            raise errors.StorageError(f"CRM answered {response.status} while resolving")
        if response.status != 200:
            raise errors.IdentityRejected(f"CRM refused the read token ({response.status})")
        try:
            revisions = response.json()["revisions"]
            return {str(k): int(v) for k, v in revisions.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise errors.StorageError(f"CRM answered an unreadable revision list: {exc!r}"
                                      ) from exc


def resolver(options: Mapping[str, Any], read_tokens: Mapping[str, str]) -> CrmResolver:
    """Entry point ``crm`` and ``billing`` of group ``agentledger.resolvers`` (billing's
    customers are the CRM's); options: ``url``."""
    return CrmResolver(plugins.url_option("crm", options), read_tokens)
