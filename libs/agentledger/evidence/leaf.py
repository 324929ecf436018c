"""The canonical form of one audit event and its leaf hash.

The database computes the same hash when it writes the row (``agentledger_audit_leaf_hash``,
migration 0050); this module is how anyone else recomputes it: ``verify-chain`` from the
rows, ``evidence verify`` from a receipt. The form is RFC 8785 over this object::

    {"v": 1, "event_id": …, "tenant_id": …, "operation_id": … | null, "type": …,
     "payload": {…}, "traceparent": … | null, "recorded_at": "YYYY-MM-DDTHH:MM:SS.ffffffZ"}

and the leaf hash is RFC 6962's: SHA-256(0x00 || canonical bytes).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final
from uuid import UUID

from agentledger import canonical
from agentledger.evidence import merkle

FORM_VERSION: Final = 1
_SAFE: Final = 2**53 - 1


def timestamp(value: datetime) -> str:
    """A time as the leaf spells it: UTC, microseconds, ``Z``."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_object(*, event_id: UUID | str, tenant_id: UUID | str,
                 operation_id: UUID | str | None, type: str, payload: Any,
                 traceparent: str | None, recorded_at: datetime | str) -> dict[str, Any]:
    """The JSON object a leaf hashes, from an ``audit_event`` row's columns."""
    return {
        "v": FORM_VERSION,
        "event_id": str(event_id),
        "tenant_id": str(tenant_id),
        "operation_id": None if operation_id is None else str(operation_id),
        "type": type,
        "payload": json.loads(payload) if isinstance(payload, str) else payload,
        "traceparent": traceparent,
        "recorded_at": recorded_at if isinstance(recorded_at, str) else timestamp(recorded_at),
    }


def _as_stored(value: Any) -> Any:
    """What the database's canonical form sees: an integer beyond IEEE 754's safe range is
    a double there (as in ECMAScript), never an error."""
    if isinstance(value, dict):
        return {k: _as_stored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_stored(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _SAFE:
        return float(value)
    return value


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 bytes of a JSON value as the database canonicalizes it (an integer
    beyond ±(2^53 - 1) as the double it rounds to), for events and the receipts holding them.

    Raises:
        errors.ValidationFailed: a value has no canonical form.
    """
    return canonical.canonical_bytes(_as_stored(value))


def canonical_event(event: dict[str, Any]) -> bytes:
    """The RFC 8785 bytes of an event object (see :func:`canonical_json`)."""
    return canonical_json(event)


def leaf_hash(event: dict[str, Any]) -> bytes:
    """The RFC 6962 leaf hash of an event object."""
    return merkle.leaf_hash(canonical_event(event))
