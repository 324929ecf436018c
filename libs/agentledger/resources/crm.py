"""Resolve targets through the CRM's read API with a READ-only, per-tenant token (R1.4, R1.7)."""

from __future__ import annotations

from collections.abc import Mapping
from uuid import UUID

import httpx

from agentledger import errors
from agentledger.resources import Resource, not_found

# A resolution is one indexed read; past this the CRM is unwell and admission should retry
# the proposal later rather than hold its consumer.
TIMEOUT_S = 5.0


class CrmResolver:
    """Looks customers up in the CRM, in the proposal's tenant only."""

    def __init__(
        self, base_url: str, read_tokens: Mapping[str, str], *,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        """Args:
            base_url: the CRM's URL.
            read_tokens: tenant id → a token with only the ``read`` scope for that tenant.
            client: an HTTP client to share; one is created otherwise.
        """
        self._tokens = dict(read_tokens)
        self._client = client or httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT_S)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def resolve(self, tenant_id: UUID, connector: str, resource_id: str) -> Resource:
        token = self._tokens.get(str(tenant_id))
        if token is None:
            raise not_found(resource_id)  # a tenant we hold no scope for has no resources
        try:
            response = await self._client.get(
                f"/v1/customers/{resource_id}", headers={"Authorization": f"Bearer {token}"}
            )
        except httpx.HTTPError as exc:
            raise errors.StorageError(f"CRM unreachable while resolving: {exc!r}") from exc
        if response.status_code in (404, 422):
            raise not_found(resource_id)
        if response.status_code >= 500:
            raise errors.StorageError(f"CRM answered {response.status_code} while resolving")
        if response.status_code != 200:
            raise errors.IdentityRejected(f"CRM refused the read token ({response.status_code})")
        etag = response.headers.get("ETag", "")
        return Resource(connector, resource_id, etag.removeprefix("W/").strip('"') or None)
