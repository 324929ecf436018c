"""Error codes from the specification only (issue 40 item 3), and what the status tool tells
from the ledger (issue 38's leftovers)."""

from __future__ import annotations

import ast
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agentledger import identity
from agentledger.mcp import directory, results

MCP_PACKAGE = Path(directory.__file__).parent
# MCP 2026-07-28 reserves -32020..-32099 for codes it defines; a server must not emit one
# it does not define.
RESERVED = range(-32099, -32019)


def reserved_literals(source: str) -> list[int]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
                and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, int)
                and -node.operand.value in RESERVED):
            found.append(-node.operand.value)
    return found


def test_the_mcp_package_defines_no_code_of_the_reserved_range() -> None:
    found = {path.name: reserved_literals(path.read_text()) for path in MCP_PACKAGE.glob("*.py")}
    assert {name: codes for name, codes in found.items() if codes} == {}


def test_the_check_fires_on_the_code_issue_40_removed() -> None:
    assert reserved_literals("UNAUTHENTICATED: Final = -32040") == [-32040]
    assert reserved_literals("INVALID_PARAMS = -32602") == []


def known(**fields: object) -> directory.Known:
    base: dict[str, object] = {"proposer": "user:alice", "state": None, "receipt": None,
                               "reason": None, "approval_id": None, "approval_state": None,
                               "since": datetime.now(UTC), "updated": datetime.now(UTC)}
    return directory.Known(**{**base, **fields})  # type: ignore[arg-type]


OP = uuid.uuid4()
APPROVAL = uuid.uuid4()


@pytest.mark.parametrize(("recorded", "status", "is_error"), [
    (known(approval_state="pending", approval_id=APPROVAL), "pending_approval", False),
    (known(approval_state="approved", approval_id=APPROVAL), "in_progress", False),
    (known(approval_state="denied", reason="no"), "denied", True),
    (known(approval_state="expired"), "expired", True),
    (known(state="pending"), "in_progress", False),
    (known(state="dispatching"), "in_progress", False),
    (known(state="succeeded", receipt="crm:note:1"), "succeeded", False),
    (known(state="unknown"), "unknown", True),
    (known(state="failed", reason="declined"), "failed", True),
    (known(state="review_required"), "review_required", True),
])
def test_the_ledger_is_told_as_the_status_union(recorded: directory.Known, status: str,
                                                 is_error: bool) -> None:
    answer = results.from_known(recorded, OP, "http://console")
    assert (answer.status, answer.is_error, answer.operation_id) == (status, is_error, OP)
    assert answer.structured()["status"] in results.OUTPUT_SCHEMA["properties"]["status"]["enum"]
    if status == "pending_approval":
        assert answer.approval_url == f"http://console/approvals/{APPROVAL}"
    if status == "succeeded":
        assert answer.receipt == "crm:note:1"


def session(principal: str, roles: tuple[str, ...]) -> identity.Session:
    return identity.Session(uuid.uuid4(), principal, roles, datetime.now(UTC))


@pytest.mark.parametrize(("asker", "allowed"), [
    (session("user:alice", ("user",)), True),                 # the proposer
    (session("user:bob", ("approver",)), True),               # an approver of the tenant
    (session("user:fiona", ("finance-approver",)), True),
    (session("ops:olga", ("agent-operator",)), True),         # an operator
    (session("user:carol", ("user",)), False),                # anyone else
    (session("user:nobody", ()), False),
])
def test_only_the_proposer_an_approver_or_an_operator_may_follow(
        asker: identity.Session, allowed: bool) -> None:
    assert directory.may_follow(asker, known(state="succeeded")) is allowed
