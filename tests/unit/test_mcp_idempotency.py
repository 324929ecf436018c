"""Which idempotency key an MCP tool call is proposed under."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from agentledger import errors, identity
from agentledger.mcp import idempotency

NOTE = {"customer_id": "c-1", "body": "hello", "target": "c-1"}


def test_a_key_in_meta_is_used_verbatim() -> None:
    meta = {idempotency.META_KEY: "my-key:1", "progressToken": 3}
    assert idempotency.key_for(meta, "user:alice", "crm.note.create", NOTE) == "my-key:1"


@pytest.mark.parametrize("bad", ["", "has space", "x" * 256, 5, "é"])
def test_a_malformed_key_in_meta_is_refused(bad: object) -> None:
    with pytest.raises(errors.ValidationFailed, match="idempotency_key"):
        idempotency.key_for({idempotency.META_KEY: bad}, "user:alice", "crm.note.create", NOTE)


def test_without_a_key_the_same_call_derives_the_same_key() -> None:
    one = idempotency.key_for(None, "user:alice", "crm.note.create", NOTE)
    reordered = dict(reversed(list(NOTE.items())))
    assert idempotency.key_for({}, "user:alice", "crm.note.create", reordered) == one
    assert one.startswith(idempotency.DERIVED_PREFIX) and len(one) == 5 + 64


def test_the_derivation_is_fixed() -> None:
    # Changing it would make a retry across an upgrade a second operation: a new prefix then.
    assert idempotency.derived_key("user:alice", "crm.note.create", NOTE) == (
        "mcp1-" + hashlib.sha256(
            b'{"arguments":{"body":"hello","customer_id":"c-1","target":"c-1"},'
            b'"principal":"user:alice","tool":"crm.note.create"}').hexdigest())


@pytest.mark.parametrize(("principal", "tool", "tool_input"), [
    ("user:bob", "crm.note.create", NOTE),
    ("user:alice", "crm.note.delete", NOTE),
    ("user:alice", "crm.note.create", {**NOTE, "body": "hello!"}),
    ("user:alice", "crm.note.create", {**NOTE, "target": "c-2"}),
])
def test_another_principal_tool_or_input_is_another_key(principal: str, tool: str,
                                                        tool_input: dict[str, str]) -> None:
    assert idempotency.derived_key(principal, tool, tool_input) != idempotency.derived_key(
        "user:alice", "crm.note.create", NOTE)


def test_the_key_fixes_the_operation_id_ingress_derives() -> None:
    tenant = uuid.uuid4()
    key = idempotency.key_for(None, "user:alice", "crm.note.create", NOTE)
    assert identity.derive_operation_id(tenant, "user:alice", key) == identity.derive_operation_id(
        tenant, "user:alice", idempotency.key_for(None, "user:alice", "crm.note.create", dict(NOTE)))


def test_an_input_without_canonical_json_is_refused() -> None:
    with pytest.raises(errors.ValidationFailed):
        idempotency.derived_key("user:alice", "crm.note.create", {"x": float("nan")})
