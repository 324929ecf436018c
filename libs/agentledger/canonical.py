"""RFC 8785 canonical JSON and the request hash that binds an approval to one command (R2.2).

The hash is what makes replay vs conflict decidable (R3.3/R3.4): two requests are "the same"
exactly when their bound fields have the same canonical form, whatever the key order or the
whitespace of the JSON they arrived in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any
from uuid import UUID

import rfc8785

from agentledger import errors


def canonical_bytes(obj: object) -> bytes:
    """Serialize a JSON value to its RFC 8785 (JCS) canonical form.

    Args:
        obj: A JSON value built from dicts with string keys, lists, strings, booleans,
            ``None``, integers within the IEEE 754 safe range, and finite floats.

    Returns:
        The canonical UTF-8 bytes: sorted keys, no insignificant whitespace, ECMAScript
        number formatting.

    Raises:
        errors.ValidationFailed: The value is not representable in canonical JSON (a
            non-string key, an unsafe integer, NaN/Infinity, an unsupported type).
    """
    value: Any = obj  # rfc8785 checks the value's shape itself; its own error is mapped below
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        # rfc8785's messages can quote the offending value; keep only its class name.
        raise errors.ValidationFailed(
            "value has no canonical JSON form", cause=type(exc).__name__
        ) from exc


def _uuid_text(value: UUID | str) -> str:
    """The lowercase hyphenated form, so ``UUID`` and any spelling of its string agree."""
    if isinstance(value, UUID):
        return str(value)
    try:
        return str(UUID(value))
    except (ValueError, AttributeError, TypeError) as exc:
        raise errors.ValidationFailed("tenant_id is not a UUID") from exc


def request_hash(
    *,
    tenant_id: UUID | str,
    principal_id: str,
    action: str,
    target: str,
    arguments: Mapping[str, object],
    expected_revision: str | None,
) -> bytes:
    """SHA-256 over the canonical JSON of exactly the fields an approval binds (R2.1).

    Args:
        tenant_id: The tenant, as a UUID or any string spelling of one.
        principal_id: The verified principal on whose behalf the command runs.
        action: The allowlisted action name.
        target: The resource id the command writes to.
        arguments: The validated arguments.
        expected_revision: The resource revision the write is conditional on; ``None``
            (no precondition) and ``""`` hash differently.

    Returns:
        The 32-byte digest.

    Raises:
        errors.ValidationFailed: ``tenant_id`` is not a UUID or the arguments have no
            canonical JSON form.
    """
    bound = {
        "tenant_id": _uuid_text(tenant_id),
        "principal_id": principal_id,
        "action": action,
        "target": target,
        "arguments": dict(arguments),
        "expected_revision": expected_revision,
    }
    return hashlib.sha256(canonical_bytes(bound)).digest()


def hash_hex(digest: bytes) -> str:
    """The lowercase hex form of a digest, as stored in commands and messages."""
    return digest.hex()
