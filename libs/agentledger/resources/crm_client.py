"""The CRM's read API with a READ-only, per-tenant token (R1.4, R1.7): the one read client.

Retrieval (planning's evidence) and the approval console (the record as it is now) read one
customer through :class:`CrmReader`; admission's resolver (``resources.crm``, a plugin)
batches revision checks on its hot path with the same header. The ``ETag`` is parsed once,
here, and the CRM's answers become the same errors for every reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

import httpx

from agentledger import errors

# A read is one indexed lookup; past this the CRM is unwell and the caller retries later.
TIMEOUT_S: Final = 5.0


def etag_revision(etag: str | None) -> str | None:
    """The revision an ``ETag`` header carries: ``W/"7"`` and ``"7"`` are both ``7``."""
    return (etag or "").removeprefix("W/").strip('"') or None


def auth_header(token: str) -> dict[str, str]:
    """The ``Authorization`` header carrying a tenant's read token."""
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class Customer:
    """A customer as the CRM answered just now.

    Attributes:
        record: Its fields (untrusted data); empty when the body was not an object.
        revision: Its current revision (from the ``ETag``), when the CRM sent one.
        content: The body as received, for evidence hashes.
    """

    record: Mapping[str, Any]
    revision: str | None
    content: bytes


class CrmReader:
    """Reads customers and their collections, each tenant with its own read-only token."""

    def __init__(self, base_url: str, read_tokens: Mapping[str, str], *,
                 client: httpx.AsyncClient | None = None, timeout_s: float = TIMEOUT_S) -> None:
        """Args:
            base_url: The CRM's URL (unused when ``client`` is given: it has its own).
            read_tokens: Tenant id → a token with only the ``read`` scope for that tenant.
            client: An HTTP client to share; one is created otherwise.
            timeout_s: The created client's timeout.
        """
        self._tokens = dict(read_tokens)
        self._client = client or httpx.AsyncClient(base_url=base_url, timeout=timeout_s)

    async def aclose(self) -> None:
        await self._client.aclose()

    def reads_tenant(self, tenant_id: UUID) -> bool:
        """Whether a read token is configured for the tenant (else it has no resources)."""
        return str(tenant_id) in self._tokens

    async def get(self, tenant_id: UUID, path: str) -> httpx.Response | None:
        """``GET path`` with the tenant's token; None without one.

        Raises:
            errors.StorageError: The CRM is unreachable.
        """
        token = self._tokens.get(str(tenant_id))
        if token is None:
            return None
        try:
            return await self._client.get(path, headers=auth_header(token))
        except httpx.HTTPError as exc:
            raise errors.StorageError(f"CRM unreachable: {exc!r}") from exc

    async def customer(self, tenant_id: UUID, customer_id: str) -> Customer | None:
        """The customer, or None when the tenant has none by this id (or no token).

        Raises:
            errors.StorageError: The CRM is unreachable, failing, or answered no JSON.
            errors.IdentityRejected: The CRM refused the read token.
        """
        response = await self.get(tenant_id, f"/v1/customers/{customer_id}")
        if response is None or response.status_code in (404, 422):
            return None
        check(response)
        body = json_body(response)
        return Customer(body if isinstance(body, dict) else {},
                        etag_revision(response.headers.get("ETag")), response.content)


def check(response: httpx.Response) -> None:
    """Raise unless the CRM answered 200.

    Raises:
        errors.IdentityRejected: 401/403, the token was refused.
        errors.StorageError: Anything else (retryable).
    """
    if response.status_code in (401, 403):
        raise errors.IdentityRejected(f"CRM refused the read token ({response.status_code})")
    if response.status_code != 200:
        raise errors.StorageError(f"CRM answered {response.status_code}")


def json_body(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError as exc:
        raise errors.StorageError("CRM answered a body that is not JSON") from exc
