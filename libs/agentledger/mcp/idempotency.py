"""Which idempotency key a tool call is proposed under: a retried call is the same operation.

Ingress derives the operation id from (tenant, principal, idempotency key)
(:func:`agentledger.identity.derive_operation_id`), so the key fixes the operation:

- a key the client sends in the call's ``_meta`` under ``META_KEY``
  (``"dev.agentledger/idempotency_key"``, reverse-DNS as MCP asks of ``_meta`` keys; the
  older ``"agentledger/idempotency_key"`` is still read) is used verbatim: a client that
  means two identical calls to be two operations gives them two keys;
- without one, the key is ``"mcp1-"`` + hex SHA-256 of the RFC 8785 canonical JSON of
  ``{"principal": <principal id>, "tool": <tool name>, "arguments": <the whole tool input>}``:
  the same principal calling the same tool with the same input always names the same
  operation (a retry after a lost answer, by the client or by the model, never acts twice),
  and another principal, tool or input never collides with it. Identical calls are one
  operation, on purpose; the key format is versioned (``mcp1``) so the derivation can change
  without old keys aliasing new ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from agentledger import canonical, errors, identity

META_KEY: Final = "dev.agentledger/idempotency_key"
# The name before issue 40, still read (never both at once with different values).
LEGACY_META_KEY: Final = "agentledger/idempotency_key"
DERIVED_PREFIX: Final = "mcp1-"


def derived_key(principal_id: str, tool: str, tool_input: Mapping[str, Any]) -> str:
    """The key of a call without one in ``_meta`` (see the module docstring).

    Raises:
        errors.ValidationFailed: The input has no canonical JSON form (e.g. a NaN).
    """
    digest = hashlib.sha256(canonical.canonical_bytes(
        {"principal": principal_id, "tool": tool, "arguments": dict(tool_input)})).hexdigest()
    return DERIVED_PREFIX + digest


def key_for(meta: Mapping[str, Any] | None, principal_id: str, tool: str,
            tool_input: Mapping[str, Any]) -> str:
    """The idempotency key of a tool call: the client's from ``_meta``, else derived.

    Raises:
        errors.ValidationFailed: The ``_meta`` key is not 1-255 characters of
            ``A-Z a-z 0-9 . _ : ~ -`` (what ingress accepts), or the input has no canonical
            JSON form.
    """
    given = meta_value(meta, META_KEY, LEGACY_META_KEY)
    if given is None:
        return derived_key(principal_id, tool, tool_input)
    if not isinstance(given, str) or not identity.is_idempotency_key(given):
        raise errors.ValidationFailed(
            f"_meta[{META_KEY!r}] must be 1-255 characters of A-Z a-z 0-9 . _ : ~ -")
    return given


def meta_value(meta: Mapping[str, Any] | None, key: str, legacy: str) -> object:
    """``_meta[key]``, else ``_meta[legacy]`` (the name before issue 40).

    Raises:
        errors.ValidationFailed: Both are given, with different values.
    """
    found = meta or {}
    new, old = found.get(key), found.get(legacy)
    if new is not None and old is not None and new != old:
        raise errors.ValidationFailed(f"_meta[{key!r}] and _meta[{legacy!r}] differ")
    return new if new is not None else old
