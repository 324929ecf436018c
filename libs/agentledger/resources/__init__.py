"""Resolving a proposal's target inside its tenant before admission (R1.4).

A resolver answers "does this resource exist for this tenant, and at which revision?". A
resource of another tenant is indistinguishable from a missing one: both raise
``ResourceNotFound`` with the same message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from agentledger import errors


@dataclass(frozen=True)
class Resource:
    """A resolved target."""

    connector: str
    resource_id: str
    revision: str | None


class Resolver(Protocol):
    """Finds a target inside one tenant."""

    async def resolve(self, tenant_id: UUID, connector: str, resource_id: str) -> Resource:
        """Return the resource, or raise ``errors.ResourceNotFound``."""
        ...


def not_found(resource_id: str) -> errors.ResourceNotFound:
    # The id is the caller's own input; the message never says whether another tenant has it.
    return errors.ResourceNotFound(f"resource {resource_id[:128]!r} not found in this tenant")


class MappingResolver:
    """Resolves from an in-memory directory: for unit tests and offline evaluation."""

    def __init__(self, directory: Mapping[tuple[UUID, str, str], str | None]) -> None:
        self._directory = dict(directory)

    async def resolve(self, tenant_id: UUID, connector: str, resource_id: str) -> Resource:
        key = (tenant_id, connector, resource_id)
        if key not in self._directory:
            raise not_found(resource_id)
        return Resource(connector, resource_id, self._directory[key])
