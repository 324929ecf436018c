"""A pending approval as a Task of the tasks extension (``io.modelcontextprotocol/tasks``).

To a client that declares the extension in its request's capabilities, a ``tools/call``
that must wait for a person answers a ``CreateTaskResult`` instead of the
``pending_approval`` text: the task id is the operation id, and the task is the ledger's
record of it (the approval request, then the command), so it is durable before the answer
(the approval request is committed before admission answers) and any replica serves it.
``tasks/get`` reads the ledger at each poll:

============================== =============== ==========================================
ledger                         task status     what it carries
============================== =============== ==========================================
approval pending               input_required  a URL elicitation to the approval page
approved, not yet admitted;    working
admitted, in flight
``unknown``                    working         ``statusMessage``: reconciliation decides
succeeded, denied, expired,    completed       ``result``: the tool call's result (a
failed, review_required                        refusal is ``isError``, never ``failed``)
============================== =============== ==========================================

``failed`` is never used: the extension keeps it for JSON-RPC errors, and a refusal is a
tool result. The person decides in the console (the elicitation only points there), so
``tasks/update`` acknowledges and changes nothing; ``tasks/cancel`` acknowledges and
cancels nothing (an approval is decided, or it expires). Every task request is checked
like the status tool: a current principal (the gate), and the operation's proposer or an
approver or operator of its tenant; any other id is an unknown task. A client that did
not declare the extension gets ``-32021`` (missing required client capability) for the
``tasks/*`` methods, and today's answer for its calls.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Final

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import Field

from agentledger.mcp import directory, results

EXTENSION: Final = "io.modelcontextprotocol/tasks"
# How often a client should ask: an approval takes a person minutes; two seconds keeps the
# answer prompt once decided without a poll storm (each poll is one ledger read).
POLL_INTERVAL_MS: Final = 2000


class TaskParams(types.RequestParams):
    """``tasks/get`` and ``tasks/cancel``: the task id."""

    task_id: str = Field(alias="taskId", max_length=64)


class UpdateParams(TaskParams):
    """``tasks/update``: answers to the task's input requests (acknowledged, not used)."""

    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the extension."""
    capabilities = getattr(ctx.session, "client_capabilities", None)
    extensions = getattr(capabilities, "extensions", None)
    return isinstance(extensions, dict) and EXTENSION in extensions


def require_declared(ctx: ServerRequestContext[Any, Any]) -> None:
    """Raises: MCPError: ``MISSING_REQUIRED_CLIENT_CAPABILITY`` for a non-declaring client."""
    if not declared(ctx):
        raise MCPError(types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                       f"the tasks/* methods need the {EXTENSION} extension",
                       {"requiredCapabilities": {"extensions": {EXTENSION: {}}}})


def task_id(params: TaskParams) -> uuid.UUID:
    """Raises: MCPError: ``INVALID_PARAMS``, not an operation id (an unknown task)."""
    try:
        return uuid.UUID(params.task_id)
    except ValueError as exc:
        raise MCPError(types.INVALID_PARAMS, "unknown taskId") from exc


def _stamp(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def _task(operation_id: uuid.UUID, known: directory.Known, status: str,
          message: str | None) -> dict[str, Any]:
    found: dict[str, Any] = {
        "taskId": str(operation_id), "status": status, "createdAt": _stamp(known.since),
        "lastUpdatedAt": _stamp(known.updated), "ttlMs": None,
        "pollIntervalMs": POLL_INTERVAL_MS}
    if message:
        found["statusMessage"] = message
    return found


def created(operation_id: uuid.UUID, known: directory.Known) -> dict[str, Any]:
    """The ``CreateTaskResult`` for a call whose approval is pending (``known`` read back
    from the ledger: the task resolves)."""
    return {**_task(operation_id, known, "input_required",
                    "a person must approve this operation before it happens"),
            "resultType": "task"}


def detailed(operation_id: uuid.UUID, known: directory.Known, console_url: str
             ) -> dict[str, Any]:
    """The ``GetTaskResult`` for what the ledger records now."""
    answer = results.from_known(known, operation_id, console_url)
    if answer.status == "pending_approval":
        task = _task(operation_id, known, "input_required", answer.text())
        task["inputRequests"] = {f"approval-{answer.approval_id}": {
            "method": "elicitation/create",
            "params": {"mode": "url", "url": answer.approval_url,
                       "message": "A person must approve this operation in the approvals "
                                  "console before it happens."}}}
    elif answer.status in ("in_progress", "unknown"):
        task = _task(operation_id, known, "working",
                     answer.text() if answer.status == "unknown" else None)
    else:
        task = _task(operation_id, known, "completed", None)
        task["result"] = answer.to_result().model_dump(by_alias=True, exclude_none=True,
                                                       mode="json")
    return {**task, "resultType": "complete"}
