"""The MCP tool catalog: closed input schemas from the allowlist, filtered by the policy."""

from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime

import jsonschema
import pytest

from agentledger import errors, identity
from agentledger.mcp import tools
from agentledger.policy import allowlist, cedar

ALLOWLIST = allowlist.Allowlist.load()
CATALOG = tools.Catalog(ALLOWLIST, cedar.CedarPolicy())
TENANT = uuid.uuid4()
ACTIONS = {"crm.note.create", "crm.contact.update", "billing.refund.create"}


def session(*roles: str, principal: str = "user:alice") -> identity.Session:
    return identity.Session(TENANT, principal, roles, datetime(2100, 1, 1, tzinfo=UTC))


def test_an_input_schema_is_the_actions_closed_schema_plus_target() -> None:
    schema = tools.input_schema(ALLOWLIST.get("crm.note.create"))
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["customer_id", "body", "target"]
    # The run handle is optional: a call without one is its own run.
    assert set(schema["properties"]) == {"customer_id", "body", "target", "run"}
    assert schema["properties"]["target"]["maxLength"] == 128
    jsonschema.Draft202012Validator.check_schema(schema)
    valid = {"customer_id": "c-1", "body": "hello", "target": "c-1"}
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(valid))
    assert list(jsonschema.Draft202012Validator(schema).iter_errors({**valid, "extra": 1}))


def test_expected_revision_is_required_only_where_the_action_requires_it() -> None:
    update = tools.input_schema(ALLOWLIST.get("crm.contact.update"))
    assert "expected_revision" in update["required"]
    assert update["properties"]["expected_revision"]["maxLength"] == 64
    refund = tools.input_schema(ALLOWLIST.get("billing.refund.create"))
    assert "expected_revision" not in refund["properties"]


def test_an_action_using_a_reserved_argument_name_is_a_configuration_error() -> None:
    document = {"format": allowlist.FILE_FORMAT, "actions": [{
        "name": "crm.thing.move", "connector": "crm", "risk": "low", "requires_revision": False,
        "description": "Move a thing.", "arguments": {
            "type": "object", "additionalProperties": False, "required": ["target"],
            "properties": {"target": {"type": "string", "maxLength": 10}}}}]}
    with pytest.raises(errors.ConfigurationError, match="reserved"):
        tools.Catalog(allowlist.Allowlist.from_document(document), cedar.CedarPolicy())


def test_the_allowlist_schema_is_not_changed_by_building_tools() -> None:
    before = copy.deepcopy(dict(ALLOWLIST.get("crm.note.create").schema))
    tools.input_schema(ALLOWLIST.get("crm.note.create"))["properties"]["body"]["maxLength"] = 1
    assert dict(ALLOWLIST.get("crm.note.create").schema) == before


@pytest.mark.parametrize(("roles", "expected"), [
    (("user",), {"crm.note.create": "allow", "crm.contact.update": "require_approval",
                 "billing.refund.create": "require_approval"}),
    (("agent-operator",), {"crm.note.create": "allow", "crm.contact.update": "require_approval",
                           "billing.refund.create": "require_approval"}),
    ((), {}),
    (("approver", "finance-approver"), {}),
])
def test_the_listing_holds_what_the_roles_may_propose(roles: tuple[str, ...],
                                                      expected: dict[str, str]) -> None:
    # The packaged actions (an allowlist may hold more: they are judged the same way).
    found = CATALOG.effects(session(*roles))
    assert {name: effect for name, effect in found.items() if name in ACTIONS} == expected
    names = [t.name for t in CATALOG.tools(session(*roles))]
    # The run opener only for who may propose anything; the status tool always, last.
    assert names == [*sorted(found), *([tools.OPEN_RUN_TOOL] if found else []), tools.STATUS_TOOL]
    if not {"user", "agent-operator"} & set(roles):
        assert names == [tools.STATUS_TOOL]


def test_a_tool_that_needs_approval_says_so() -> None:
    listed = {t.name: t for t in CATALOG.tools(session("user"))}
    assert "approve" in (listed["billing.refund.create"].description or "")
    assert "approve" not in (listed["crm.note.create"].description or "")
    note, status = listed["crm.note.create"].annotations, listed[tools.STATUS_TOOL].annotations
    assert note is not None and note.idempotent_hint is True and note.read_only_hint is False
    assert status is not None and status.read_only_hint is True


def test_split_separates_arguments_target_and_revision() -> None:
    call = tools.split(ALLOWLIST.get("crm.contact.update"), {
        "customer_id": "c-1", "changes": {"city": "Paris"}, "target": "c-1",
        "expected_revision": "7"})
    assert call == tools.ToolCall({"customer_id": "c-1", "changes": {"city": "Paris"}}, "c-1", "7")


@pytest.mark.parametrize(("action", "tool_input", "path"), [
    ("crm.note.create", {"customer_id": "c-1", "body": "x"}, "/target"),
    ("crm.note.create", {"customer_id": "c-1", "body": "x", "target": "bad target"}, "/target"),
    ("crm.note.create", {"customer_id": "c-1", "target": "c-1"}, "/"),
    ("crm.note.create", {"customer_id": "c-1", "body": "x", "target": "c-1",
                         "expected_revision": "3"}, "/expected_revision"),
    ("crm.contact.update", {"customer_id": "c-1", "changes": {"city": "P"}, "target": "c-1"},
     "/expected_revision"),
])
def test_split_refuses_what_admission_would_refuse(action: str, tool_input: dict[str, object],
                                                   path: str) -> None:
    with pytest.raises(errors.InvalidArguments) as caught:
        tools.split(ALLOWLIST.get(action), tool_input)
    violations = caught.value.details["violations"]
    assert isinstance(violations, list)
    assert path in [v["path"] for v in violations]


def test_the_status_tool_takes_one_operation_id() -> None:
    op = uuid.uuid4()
    assert tools.status_operation({"operation_id": str(op)}) == op
    for bad in ({}, {"operation_id": "nope"}, {"operation_id": str(op), "x": 1},
                {"operation_id": 5}):
        with pytest.raises(errors.InvalidArguments):
            tools.status_operation(bad)


def test_input_schemas_by_name_are_the_listed_ones() -> None:
    listed = {t.name: t.input_schema for t in CATALOG.tools(session("user"))}
    for name, schema in listed.items():
        assert CATALOG.input_schema_of(name) == schema
    assert CATALOG.input_schema_of("crm.unknown.thing") is None


def test_a_run_handle_is_split_from_the_arguments_and_checked() -> None:
    spec = ALLOWLIST.get("crm.note.create")
    call = tools.split(spec, {"customer_id": "c-1", "body": "b", "target": "c-1", "run": "run-1"})
    assert (call.arguments, call.run) == ({"customer_id": "c-1", "body": "b"}, "run-1")
    with pytest.raises(errors.InvalidArguments) as caught:
        tools.split(spec, {"customer_id": "c-1", "body": "b", "target": "c-1", "run": "not a run"})
    assert caught.value.details["violations"] == [{"path": "/run", "message": "not a run handle"}]
