"""A pending approval as a Task (issue 40 item 4): the task states the ledger maps to, and the
tasks/* methods' refusals, in process (the real flow: tests/e2e/test_mcp_oauth.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.testclient import TestClient

from agentledger.mcp import directory, server, tasks
from tests.unit.test_mcp_server import DIRECTORY, TENANT, Table, settings, token

OP, APPROVAL = uuid.uuid4(), uuid.uuid4()
AT = datetime(2026, 7, 28, 12, 0, tzinfo=UTC)


def known(**fields: object) -> directory.Known:
    base: dict[str, object] = {"proposer": "user:alice", "state": None, "receipt": None,
                               "reason": None, "approval_id": APPROVAL, "approval_state": "pending",
                               "since": AT, "updated": AT}
    return directory.Known(**{**base, **fields})  # type: ignore[arg-type]


def test_a_pending_approval_is_input_required_with_a_url_elicitation_to_its_page() -> None:
    found = tasks.detailed(OP, known(), "http://console")
    assert (found["taskId"], found["status"], found["resultType"]) == (str(OP), "input_required", "complete")
    assert found["createdAt"] == "2026-07-28T12:00:00Z" and found["pollIntervalMs"] == tasks.POLL_INTERVAL_MS
    assert found["inputRequests"] == {f"approval-{APPROVAL}": {
        "method": "elicitation/create",
        "params": {"mode": "url", "url": f"http://console/approvals/{APPROVAL}",
                   "message": found["inputRequests"][f"approval-{APPROVAL}"]["params"]["message"]}}}
    assert tasks.created(OP, known())["resultType"] == "task"


def test_after_the_decision_working_then_completed_with_the_tool_result() -> None:
    assert tasks.detailed(OP, known(approval_state="approved"), "c")["status"] == "working"
    assert tasks.detailed(OP, known(approval_state="approved", state="dispatching"), "c")["status"] == "working"
    unknown = tasks.detailed(OP, known(approval_state="approved", state="unknown"), "c")
    assert unknown["status"] == "working" and unknown["statusMessage"].startswith("unknown:")
    done = tasks.detailed(OP, known(approval_state="approved", state="succeeded",
                                    receipt="crm:refund:1"), "c")
    assert done["status"] == "completed" and done["result"]["isError"] is False
    assert done["result"]["structuredContent"] == {"status": "succeeded", "operation_id": str(OP),
                                                   "receipt": "crm:refund:1"}
    # A refusal completes with an error result: `failed` is for JSON-RPC errors only.
    denied = tasks.detailed(OP, known(approval_state="denied", reason="too much"), "c")
    assert denied["status"] == "completed" and denied["result"]["isError"] is True
    assert denied["result"]["structuredContent"]["status"] == "denied"


class Ledger(Table):
    def __init__(self, operations: dict[uuid.UUID, directory.Known]) -> None:
        super().__init__(DIRECTORY)
        self.operations = operations

    async def operation(self, tenant_id: uuid.UUID, operation_id: uuid.UUID) -> directory.Known | None:
        return self.operations.get(operation_id) if tenant_id == TENANT else None


def _rpc(http: TestClient, method: str, params: dict[str, Any], subject: str,
         extensions: dict[str, Any]) -> httpx.Response:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions}}
    return http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method,
                                   "params": {**params, "_meta": meta}},
                     headers={"Authorization": f"Bearer {token(['user'], subject=subject)}",
                              "Accept": "application/json, text/event-stream",
                              "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method,
                              "Mcp-Name": str(params.get("taskId", ""))})


def test_the_tasks_methods_are_for_declaring_clients_and_the_operations_followers_only() -> None:
    cfg = settings()
    gate = server.gate(cfg, httpx.AsyncClient())
    gate.directory = Ledger({OP: known()})
    app = server.http_app(server.build(cfg, gate), cfg, gate)
    declared = {tasks.EXTENSION: {}}
    with TestClient(app, base_url="http://127.0.0.1:8060") as http:
        discovered = _rpc(http, "server/discover", {}, "user:alice", {}).json()["result"]
        assert tasks.EXTENSION in discovered["capabilities"]["extensions"]
        got = _rpc(http, "tasks/get", {"taskId": str(OP)}, "user:alice", declared).json()
        assert got["result"]["status"] == "input_required", got
        assert _rpc(http, "tasks/get", {"taskId": str(OP)}, "user:bob", declared).json()[
            "result"]["taskId"] == str(OP)  # an approver of the tenant
        missing = _rpc(http, "tasks/get", {"taskId": str(OP)}, "user:alice", {}).json()
        assert missing["error"]["code"] == -32021  # the extension's own code
        for subject, task in (("user:alice", str(uuid.uuid4())), ("user:alice", "not-an-id")):
            unknown = _rpc(http, "tasks/get", {"taskId": task}, subject, declared).json()
            assert unknown["error"]["code"] == -32602, unknown
        acked = _rpc(http, "tasks/cancel", {"taskId": str(OP)}, "user:alice", declared).json()
        assert acked["result"]["resultType"] == "complete"
