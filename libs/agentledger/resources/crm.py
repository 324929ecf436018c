"""Resolve targets through the CRM's read API with a READ-only, per-tenant token (R1.4, R1.7)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote
from uuid import UUID

import aiohttp

from agentledger import errors, httpclient
from agentledger.resources import Resource, not_found

# A resolution is one indexed read; past this the CRM is unwell and admission should retry
# the proposal later rather than hold its consumer.
TIMEOUT_S = 5.0


class CrmResolver:
    """Looks customers up in the CRM, in the proposal's tenant only."""

    def __init__(self, base_url: str, read_tokens: Mapping[str, str]) -> None:
        """Args:
            base_url: the CRM's URL.
            read_tokens: tenant id → a token with only the ``read`` scope for that tenant.
        """
        self._tokens = dict(read_tokens)
        self._client = httpclient.Client(base_url,
                                         timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))

    async def aclose(self) -> None:
        await self._client.aclose()

    async def resolve(self, tenant_id: UUID, connector: str, resource_id: str) -> Resource:
        token = self._tokens.get(str(tenant_id))
        if token is None:
            raise not_found(resource_id)  # a tenant we hold no scope for has no resources
        try:
            response = await self._client.request(
                "GET", f"/v1/customers/{quote(resource_id, safe='')}",
                headers={"Authorization": f"Bearer {token}"})
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise errors.StorageError(f"CRM unreachable while resolving: {exc!r}") from exc
        if response.status in (404, 422):
            raise not_found(resource_id)
        if response.status >= 500:
            raise errors.StorageError(f"CRM answered {response.status} while resolving")
        if response.status != 200:
            raise errors.IdentityRejected(f"CRM refused the read token ({response.status})")
        etag = response.headers.get("ETag", "")
        return Resource(connector, resource_id, etag.removeprefix("W/").strip('"') or None)
