"""The tools an MCP client sees: allowlisted actions with their closed schemas, and the
status tool.

A tool's input is the action's arguments plus ``target`` (the record the action changes)
and, for an action conditional on the record's revision, ``expected_revision``; it stays
closed (``additionalProperties: false``) like the allowlist's schema it extends. Which tools
a caller sees is what the Cedar policy lets its session's roles propose at all (effect
``allow`` or ``require_approval``). The listing is advice to the model, not the decision:
admission decides every call again, with its arguments and the principal directory's roles.

Pure: no I/O beyond reading the allowlist and policy objects handed in.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import mcp_types as types
import pydantic

from agentledger import errors, identity
from agentledger.contracts import common
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import cedar

STATUS_TOOL: Final = "agentledger_status"
# Opens a run and answers its handle; a call passes the handle as its `run` argument.
OPEN_RUN_TOOL: Final = "agentledger_open_run"
TARGET: Final = "target"
REVISION: Final = "expected_revision"
RUN: Final = "run"
# The resource a listing asks the policy about: any in-tenant record. Policies that tell
# records apart still decide per call at admission, with the real target.
LISTING_RESOURCE: Final = "mcp-tools-list"

_TARGET = pydantic.TypeAdapter(common.ResourceId)
_REVISION = pydantic.TypeAdapter(common.Revision)
_OPERATION = pydantic.TypeAdapter(common.Uuid)


def _string_schema(adapter: pydantic.TypeAdapter[str], description: str) -> dict[str, Any]:
    # The contract's own bounds (one definition per shape), as JSON Schema.
    schema = {k: v for k, v in adapter.json_schema().items()
              if k in ("type", "minLength", "maxLength", "pattern")}
    return {**schema, "description": description}


TARGET_SCHEMA: Final = _string_schema(
    _TARGET, "The record the action changes, in your tenant (for the CRM and billing "
             "actions: the customer id, equal to customer_id).")
REVISION_SCHEMA: Final = _string_schema(
    _REVISION, "The record's revision you read: the change happens only if the record is "
               "still at it.")
RUN_SCHEMA: Final[dict[str, Any]] = {
    "type": "string", "minLength": 1, "maxLength": 128, "pattern": identity.RUN_NAME_PATTERN,
    "description": f"The run this call is a step of: a handle {OPEN_RUN_TOOL} answered. The "
                   "steps of a run share its budget; without one, the call is its own run."}
OPEN_RUN_SCHEMA: Final[dict[str, Any]] = {
    "type": "object", "additionalProperties": False, "properties": {}}


def input_schema(spec: allowlist_mod.ActionSpec) -> dict[str, Any]:
    """The closed input schema of an action's tool.

    Raises:
        errors.ConfigurationError: The action has an argument named ``target`` or
            ``expected_revision``, which the tool input reserves.
    """
    schema = copy.deepcopy(dict(spec.schema))
    properties: dict[str, Any] = dict(schema.get("properties", {}))
    taken = {TARGET, REVISION, RUN} & set(properties)
    if taken:
        raise errors.ConfigurationError(
            f"action {spec.name}: argument names {sorted(taken)} are reserved by the MCP "
            "tool input")
    properties[TARGET] = copy.deepcopy(TARGET_SCHEMA)
    properties[RUN] = copy.deepcopy(RUN_SCHEMA)
    required = [*schema.get("required", []), TARGET]
    if spec.requires_revision:
        properties[REVISION] = copy.deepcopy(REVISION_SCHEMA)
        required.append(REVISION)
    schema.pop("$schema", None)
    return {**schema, "type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


STATUS_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["operation_id"],
    "properties": {"operation_id": {
        "type": "string", "format": "uuid", "minLength": 36, "maxLength": 36,
        "description": "The operation_id a call of an agentledger tool answered with."}},
}


@dataclass(frozen=True)
class ToolCall:
    """A tool input split into what a proposal carries."""

    arguments: dict[str, Any]
    target: str
    expected_revision: str | None
    run: str | None = None


def split(spec: allowlist_mod.ActionSpec, tool_input: Mapping[str, Any]) -> ToolCall:
    """Split a tool input into the proposal's arguments, target and expected revision, and
    check them as admission will (schema, revision required).

    Raises:
        errors.InvalidArguments: With ``details["violations"]`` (paths, never values).
    """
    arguments = {k: v for k, v in tool_input.items() if k not in (TARGET, REVISION, RUN)}
    violations: list[dict[str, str]] = []
    target = tool_input.get(TARGET)
    try:
        _TARGET.validate_python(target, strict=True)
    except pydantic.ValidationError:
        violations.append({"path": f"/{TARGET}", "message": "required: a record id (see the "
                                                            "input schema's pattern)"})
    revision = tool_input.get(REVISION)
    if revision is not None:
        if not spec.requires_revision:
            violations.append({"path": f"/{REVISION}", "message": "not taken by this action"})
        else:
            try:
                _REVISION.validate_python(revision, strict=True)
            except pydantic.ValidationError:
                violations.append({"path": f"/{REVISION}", "message": "not a revision"})
    try:
        spec.validate(arguments)
        spec.check_revision(revision if isinstance(revision, str) else None)
    except errors.InvalidArguments as exc:
        found = exc.details.get("violations")
        violations += list(found) if isinstance(found, list) else []
    run = tool_input.get(RUN)
    if run is not None and not (isinstance(run, str) and identity.is_run_name(run)):
        violations.append({"path": f"/{RUN}", "message": "not a run handle"})
    if violations:
        raise errors.InvalidArguments(
            f"the input of {spec.name} violates its schema", action=spec.name,
            violations=violations[:allowlist_mod.MAX_VIOLATIONS])
    assert isinstance(target, str)
    return ToolCall(arguments, target, revision if isinstance(revision, str) else None,
                    run if isinstance(run, str) else None)


def status_operation(tool_input: Mapping[str, Any]) -> common.Uuid:
    """The operation id the status tool is asked about.

    Raises:
        errors.InvalidArguments: Not exactly ``{"operation_id": <uuid>}``.
    """
    if set(tool_input) != {"operation_id"} or not isinstance(tool_input["operation_id"], str):
        raise errors.InvalidArguments(
            f"{STATUS_TOOL} takes exactly one argument, operation_id",
            violations=[{"path": "/operation_id", "message": "required: a UUID"}])
    try:
        return _OPERATION.validate_python(tool_input["operation_id"])
    except pydantic.ValidationError as exc:
        raise errors.InvalidArguments(
            "operation_id is not a UUID",
            violations=[{"path": "/operation_id", "message": "not a UUID"}]) from exc


class Catalog:
    """The allowlist as MCP tools, filtered per caller by the Cedar policy."""

    def __init__(self, allowlist: allowlist_mod.Allowlist, policy: cedar.CedarPolicy,
                 output_schema: Mapping[str, Any] | None = None) -> None:
        """Build every action's input schema once; ``output_schema`` is every tool's
        (``results.OUTPUT_SCHEMA``: what ``structuredContent`` holds).

        Raises:
            errors.ConfigurationError: An action's arguments use a reserved name.
        """
        self.allowlist, self.policy = allowlist, policy
        self.output_schema = dict(output_schema) if output_schema is not None else None
        self.schemas: Mapping[str, dict[str, Any]] = {
            name: input_schema(spec) for name, spec in sorted(allowlist.actions.items())}

    def effects(self, session: identity.Session) -> dict[str, str]:
        """Action name → the policy's effect for this session's roles, for every action the
        session may propose at all (``allow`` or ``require_approval``; ``deny`` is left out)."""
        principal = cedar.Principal(session.tenant_id, session.principal_id,
                                    frozenset(session.roles))
        found: dict[str, str] = {}
        for name, spec in sorted(self.allowlist.actions.items()):
            effect = self.policy.evaluate(cedar.PolicyRequest(
                principal, spec, LISTING_RESOURCE)).effect
            if effect in ("allow", "require_approval"):
                found[name] = effect
        return found

    def input_schema_of(self, name: str) -> dict[str, Any] | None:
        """A tool's input schema by name, whoever asks (the SDK's header validation)."""
        if name == STATUS_TOOL:
            return copy.deepcopy(STATUS_SCHEMA)
        if name == OPEN_RUN_TOOL:
            return copy.deepcopy(OPEN_RUN_SCHEMA)
        schema = self.schemas.get(name)
        return copy.deepcopy(schema) if schema is not None else None

    def tools(self, session: identity.Session) -> list[types.Tool]:
        """What ``tools/list`` answers this session: its proposable actions, the run
        opener (for those who may propose anything), then status."""
        listed = [self._tool(self.allowlist.actions[name], effect)
                  for name, effect in self.effects(session).items()]
        if listed:
            listed.append(types.Tool(
                name=OPEN_RUN_TOOL,
                description=("Open a run: answers a handle to pass as the `run` argument of "
                             "each call that is a step of it. A run's steps share one budget; "
                             "open one per task. Nothing is proposed."),
                input_schema=copy.deepcopy(OPEN_RUN_SCHEMA),
                output_schema=copy.deepcopy(self.output_schema),
                annotations=types.ToolAnnotations(title="agentledger: open a run",
                                                  read_only_hint=True, open_world_hint=False)))
        return [*listed, types.Tool(
            name=STATUS_TOOL,
            description=("What is known now about an operation an agentledger tool call "
                         "started: succeeded with its receipt, pending approval, in "
                         "progress, refused, or unknown. Waits a bounded time for news."),
            input_schema=copy.deepcopy(STATUS_SCHEMA),
            output_schema=copy.deepcopy(self.output_schema),
            annotations=types.ToolAnnotations(title="agentledger: operation status",
                                              read_only_hint=True, open_world_hint=False))]

    def _tool(self, spec: allowlist_mod.ActionSpec, effect: str) -> types.Tool:
        approval = (" A person must approve it before it happens: the call answers "
                    "pending_approval with a link, and agentledger_status tells the rest."
                    if effect == "require_approval" else "")
        return types.Tool(
            name=spec.name,
            description=(f"{spec.description} Proposed through agentledger (risk "
                         f"{spec.risk}); a retried call is the same operation.{approval}"),
            input_schema=copy.deepcopy(self.schemas[spec.name]),
            output_schema=copy.deepcopy(self.output_schema),
            annotations=types.ToolAnnotations(
                title=spec.name, read_only_hint=False, destructive_hint=spec.risk != "low",
                # The same call (or the same idempotency key) is the same operation.
                idempotent_hint=True, open_world_hint=True))
