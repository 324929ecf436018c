"""What replaces the outside world in a replay (R9.2).

- ``StubCrm``: the CRM's READ API served from a case's records through an in-process httpx
  transport, so the real ``retrieval.CrmRetriever`` runs unchanged and nothing leaves the
  process. It answers reads only; any other method is counted as a violation and refused.
- ``RecordingConnector``: stands in for a real connector with the same name, actions and
  declared contract, and records each would-be call instead of making it. It keeps no
  reference to the connector it replaces, so it cannot reach the provider even by mistake.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from agentledger.connectors import base
from agentledger.evals import dataset

STUB_CRM_URL: Final = "http://crm.eval.invalid"
_PATH = re.compile(r"^/v1/customers/(?P<customer>[^/]+)(?:/(?P<collection>notes|documents))?$")


def read_token(tenant: str) -> str:
    """The (fake) READ token of a tenant's retrieval in a replay."""
    return f"eval-read-{tenant}"


@dataclass
class StubCrm:
    """Serves ``GET /v1/customers/{id}[/notes|/documents]`` from case records, per tenant.

    Attributes:
        reads: Requests answered (method and path), for the report.
        refused_writes: Non-GET requests, which a READ-only retrieval must never send.
    """

    records: Mapping[tuple[str, str], dataset.Record]
    reads: list[str] = field(default_factory=list)
    refused_writes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, records: Iterable[dataset.Record]) -> StubCrm:
        return cls({(r.tenant, r.customer_id): r for r in records})

    def tokens(self, tenants: Iterable[str]) -> dict[str, str]:
        """Tenant id → READ token, as ``CrmRetriever`` takes them."""
        return {str(dataset.tenant_id(t)): read_token(t) for t in tenants}

    def client(self) -> httpx.AsyncClient:
        """An HTTP client whose every request is answered here, in process."""
        return httpx.AsyncClient(base_url=STUB_CRM_URL, transport=httpx.MockTransport(self.handle))

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method != "GET":
            self.refused_writes.append(f"{request.method} {request.url.path}")
            return httpx.Response(405, json={"error": "the eval CRM is read-only"})
        self.reads.append(f"GET {request.url.path}")
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        tenant = token.removeprefix("eval-read-") if token.startswith("eval-read-") else None
        found = _PATH.match(request.url.path)
        if tenant is None:
            return httpx.Response(401, json={"error": "unknown token"})
        record = self.records.get((tenant, found["customer"])) if found else None
        if found is None or record is None:
            # Another tenant's customer answers exactly like a missing one (R1.4).
            return httpx.Response(404, json={"error": "not found"})
        if found["collection"] == "notes":
            if record.notes is None:
                return httpx.Response(404, json={"error": "not offered"})
            return httpx.Response(200, json={"notes": [n.model_dump() for n in record.notes]})
        if found["collection"] == "documents":
            if record.documents is None:
                return httpx.Response(404, json={"error": "not offered"})
            return httpx.Response(200, json={
                "documents": [d.model_dump() for d in record.documents]})
        body = {"customer_id": record.customer_id, "revision": record.revision, **record.fields}
        return httpx.Response(200, content=json.dumps(body).encode(),
                              headers={"ETag": f'"{record.revision}"',
                                       "Content-Type": "application/json"})


@dataclass(frozen=True)
class WouldBeCall:
    """A call a connector would have made: what the executor would have sent."""

    connector: str
    action: str
    tenant_id: str
    operation_id: str
    resource_id: str
    arguments: Mapping[str, Any]
    expected_revision: str | None


class RecordingConnector:
    """A connector that records would-be calls and answers as if applied."""

    def __init__(self, name: str, actions: frozenset[str], contract: base.Contract,
                 scopes: frozenset[base.Scope]) -> None:
        self.name = name
        self.actions = actions
        self.contract = contract
        self.scopes = scopes
        self.calls: list[WouldBeCall] = []

    @classmethod
    def replacing(cls, real: base.Connector) -> RecordingConnector:
        """A stub that declares what ``real`` declares; ``real`` itself is not kept."""
        return cls(real.name, frozenset(real.actions), real.contract, frozenset(real.scopes))

    async def execute(self, call: base.Call, token: str) -> base.Result:
        self.calls.append(WouldBeCall(
            self.name, call.action, str(call.tenant_id), str(call.operation_id),
            call.resource_id, dict(call.arguments), call.expected_revision))
        return base.Applied(f"stub:{self.name}:{call.idempotency_key}")

    async def lookup(self, call: base.Call, token: str) -> base.Lookup:
        return base.NotFound("a replay stub has no provider to ask")

    async def aclose(self) -> None:
        return None


def replace_all(connectors: Mapping[str, base.Connector]) -> dict[str, RecordingConnector]:
    """A recording stub for every connector, by name."""
    return {name: RecordingConnector.replacing(c) for name, c in connectors.items()}
