"""The versioned allowlist and its closed argument schemas (R1.2, R1.3)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agentledger import errors
from agentledger.policy import allowlist

ALLOWLIST = allowlist.Allowlist.load()

VALID: dict[str, dict[str, Any]] = {
    "crm.note.create": {"customer_id": "c-1", "body": "Called about the invoice."},
    "crm.contact.update": {"customer_id": "c-1",
                           "changes": {"email": "ada@example.com", "phone": "+41 44 123 45 67"}},
    "billing.refund.create": {"customer_id": "c-1", "invoice_id": "inv_9", "amount_minor": 1999,
                              "currency": "EUR", "reason": "Duplicate charge"},
}

# (action, overrides of the valid arguments, the path that must be reported)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("crm.note.create", {"body": "x" * 4001}, "/body"),
    ("crm.note.create", {"body": ""}, "/body"),
    ("crm.note.create", {"customer_id": "c" * 65}, "/customer_id"),
    ("crm.note.create", {"customer_id": 7}, "/customer_id"),
    ("crm.note.create", {"priority": "high"}, "/"),
    ("crm.contact.update", {"changes": {}}, "/changes"),
    ("crm.contact.update", {"changes": {"email": "not-an-email"}}, "/changes/email"),
    ("crm.contact.update", {"changes": {"email": "a@" + "b" * 250 + ".com"}}, "/changes/email"),
    ("crm.contact.update", {"changes": {"phone": "call me"}}, "/changes/phone"),
    ("crm.contact.update", {"changes": {"display_name": "n" * 201}}, "/changes/display_name"),
    ("crm.contact.update", {"changes": {"owner": "mallory"}}, "/changes"),
    ("billing.refund.create", {"amount_minor": 1_000_001}, "/amount_minor"),
    ("billing.refund.create", {"amount_minor": 0}, "/amount_minor"),
    ("billing.refund.create", {"amount_minor": "5"}, "/amount_minor"),
    ("billing.refund.create", {"amount_minor": True}, "/amount_minor"),
    ("billing.refund.create", {"amount_minor": 5.0}, "/amount_minor"),
    ("billing.refund.create", {"currency": "BTC"}, "/currency"),
    ("billing.refund.create", {"reason": "r" * 501}, "/reason"),
    ("billing.refund.create", {"invoice_id": "i" * 65}, "/invoice_id"),
]


def write(tmp_path: Path, document: object, *, name: str = "allowlist.json", **dump: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document, **dump))
    return path


def shipped() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(allowlist.DEFAULT_PATH.read_text())
    return document


# --- versioning ---------------------------------------------------------------------------


def test_version_is_the_hash_of_the_canonical_content() -> None:
    assert ALLOWLIST.version.startswith("sha256:")
    assert len(ALLOWLIST.version) == len("sha256:") + 64
    assert allowlist.Allowlist.load().version == ALLOWLIST.version


@pytest.mark.parametrize("dump", [{"indent": None}, {"indent": 7, "sort_keys": True},
                                  {"separators": (",", ":"), "ensure_ascii": False}])
def test_version_is_stable_under_reformatting(tmp_path: Path, dump: dict[str, Any]) -> None:
    document = shipped()
    reordered = {k: document[k] for k in reversed(list(document))}
    assert allowlist.Allowlist.load(write(tmp_path, reordered, **dump)).version == ALLOWLIST.version


def test_version_changes_when_content_changes(tmp_path: Path) -> None:
    document = shipped()
    document["actions"][0]["arguments"]["properties"]["body"]["maxLength"] = 3999
    assert allowlist.Allowlist.load(write(tmp_path, document)).version != ALLOWLIST.version


def test_unknown_action_error_names_the_version() -> None:
    with pytest.raises(errors.UnknownAction) as caught:
        ALLOWLIST.get("crm.account.delete")
    assert ALLOWLIST.version in caught.value.message
    assert caught.value.details["allowlist_version"] == ALLOWLIST.version


def test_unknown_action_error_does_not_echo_a_huge_name() -> None:
    with pytest.raises(errors.UnknownAction) as caught:
        ALLOWLIST.get("x" * 10_000)
    assert len(caught.value.message) < 200


# --- the shipped actions ------------------------------------------------------------------


def test_shipped_actions() -> None:
    specs = {name: (s.connector, s.risk, s.requires_revision)
             for name, s in ALLOWLIST.actions.items()}
    assert specs == {
        "crm.note.create": ("crm", "low", False),
        "crm.contact.update": ("crm", "medium", True),
        "billing.refund.create": ("billing", "high", False),
    }
    assert all(s.allowlist_version == ALLOWLIST.version for s in ALLOWLIST.actions.values())


@pytest.mark.parametrize("action", sorted(VALID))
def test_valid_arguments_pass_and_are_copied(action: str) -> None:
    arguments = copy.deepcopy(VALID[action])
    validated = ALLOWLIST.get(action).validate(arguments)
    assert validated == arguments
    assert validated is not arguments


@pytest.mark.parametrize(("action", "overrides", "path"), INVALID,
                         ids=[f"{a}:{p}:{i}" for i, (a, _, p) in enumerate(INVALID)])
def test_invalid_arguments_are_refused(action: str, overrides: dict[str, Any], path: str) -> None:
    arguments = {**VALID[action], **overrides}
    with pytest.raises(errors.InvalidArguments) as caught:
        ALLOWLIST.get(action).validate(arguments)
    violations = caught.value.details["violations"]
    assert isinstance(violations, list)
    assert path in {v["path"] for v in violations}
    assert caught.value.details["allowlist_version"] == ALLOWLIST.version


def test_missing_required_argument_is_named() -> None:
    with pytest.raises(errors.InvalidArguments) as caught:
        ALLOWLIST.get("billing.refund.create").validate({"customer_id": "c-1"})
    violations = caught.value.details["violations"]
    assert isinstance(violations, list)
    assert len(violations) == 1
    assert "amount_minor" in violations[0]["message"]
    assert "invoice_id" in violations[0]["message"]


def test_violations_never_echo_the_submitted_value() -> None:
    secret = "SECRET-" + "x" * 4000
    with pytest.raises(errors.InvalidArguments) as caught:
        ALLOWLIST.get("crm.note.create").validate(
            {"customer_id": "c-1", "body": secret, "SECRET-key" + "k" * 500: secret})
    rendered = json.dumps(caught.value.to_dict())
    assert "SECRET-x" not in rendered
    assert len(rendered) < 2000


def test_violations_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allowlist, "MAX_VIOLATIONS", 2)
    changes = {"email": 1, "phone": 2, "display_name": 3, "city": 4, "country": 5}
    with pytest.raises(errors.InvalidArguments) as caught:
        ALLOWLIST.get("crm.contact.update").validate({"customer_id": 1, "changes": changes})
    violations = caught.value.details["violations"]
    assert isinstance(violations, list)
    assert len(violations) == 2
    assert caught.value.details["truncated"] is True
    assert "6 violations" in caught.value.message


def test_revision_flag() -> None:
    update = ALLOWLIST.get("crm.contact.update")
    with pytest.raises(errors.InvalidArguments, match="expected_revision"):
        update.check_revision(None)
    with pytest.raises(errors.InvalidArguments):
        update.check_revision("")
    update.check_revision('W/"3"')
    ALLOWLIST.get("crm.note.create").check_revision(None)


def test_tool_schema_shape() -> None:
    spec = ALLOWLIST.get("billing.refund.create")
    tool = spec.tool_schema()
    assert tool["type"] == "function"
    assert tool["function"]["name"] == "billing_refund_create"
    assert tool["function"]["description"] == spec.description
    assert tool["function"]["parameters"] == dict(spec.schema)
    tool["function"]["parameters"]["properties"].clear()  # a copy: the spec is unaffected
    assert spec.schema["properties"]
    assert [t["function"]["name"] for t in ALLOWLIST.tool_schemas()] == [
        "billing_refund_create", "crm_contact_update", "crm_note_create"]


# --- the file itself is validated ---------------------------------------------------------


def _break(document: dict[str, Any], where: str) -> None:
    note = document["actions"][0]
    props = note["arguments"]["properties"]
    if where == "open-object":
        del note["arguments"]["additionalProperties"]
    elif where == "open-nested-object":
        changes = document["actions"][1]["arguments"]["properties"]["changes"]
        changes["additionalProperties"] = True
    elif where == "unbounded-string":
        del props["body"]["maxLength"]
    elif where == "unbounded-integer":
        del document["actions"][2]["arguments"]["properties"]["amount_minor"]["maximum"]
    elif where == "untyped":
        props["body"] = {"maxLength": 10}
    elif where == "anyOf":
        props["body"]["anyOf"] = [{"type": "string", "maxLength": 1}]
    elif where == "missing-revision-flag":
        del note["requires_revision"]
    elif where == "bad-risk":
        note["risk"] = "none"
    elif where == "duplicate":
        document["actions"].append(copy.deepcopy(note))
    elif where == "unknown-field":
        note["scopes"] = ["*"]
    elif where == "invalid-json-schema":
        props["body"]["maxLength"] = "many"


@pytest.mark.parametrize("where", [
    "open-object", "open-nested-object", "unbounded-string", "unbounded-integer", "untyped",
    "anyOf", "missing-revision-flag", "bad-risk", "duplicate", "unknown-field",
    "invalid-json-schema",
])
def test_non_closed_or_malformed_allowlists_are_refused(tmp_path: Path, where: str) -> None:
    document = shipped()
    _break(document, where)
    with pytest.raises(errors.ValidationFailed, match="allowlist"):
        allowlist.Allowlist.load(write(tmp_path, document))


def test_unparseable_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "allowlist.json"
    path.write_text("{not json")
    with pytest.raises(errors.ValidationFailed, match="JSON"):
        allowlist.Allowlist.load(path)


# --- control characters (issue 17) ----------------------------------------------------------

@pytest.mark.parametrize(("body", "path"), [
    ("clear \x1b[2J the screen", "/body"),        # ESC: a terminal reads it as a command
    ("pay \u202eRUE 0009\u202c", "/body"),        # a bidi override: reads other than it is stored
    ("a\x00b", "/body"),
    ("next line\x85", "/body"),                   # C1 control
])
def test_control_and_bidi_characters_are_refused_by_default(body: str, path: str) -> None:
    with pytest.raises(errors.InvalidArguments) as refused:
        ALLOWLIST.get("crm.note.create").validate({"customer_id": "c-1", "body": body})
    violations = refused.value.details["violations"]
    assert violations == [{"path": path, "message": "holds a control or bidirectional formatting character"}]
    assert body not in str(refused.value.to_dict())


def test_tabs_newlines_and_ordinary_unicode_pass() -> None:
    text = "Line one\n\tLine two\r\nGrüße, 東京, emoji 🙂, right-to-left: שלום"
    assert ALLOWLIST.get("crm.note.create").validate({"customer_id": "c-1", "body": text})["body"] == text


def test_an_action_may_declare_that_it_needs_control_characters() -> None:
    document = shipped()
    note = next(a for a in document["actions"] if a["name"] == "crm.note.create")
    note["allows_control_characters"] = True
    loaded = allowlist.Allowlist.from_document(document)
    assert loaded.get("crm.note.create").validate({"customer_id": "c-1", "body": "bell \x07"})
    assert loaded.version != ALLOWLIST.version  # a declared change of content is a new version
    with pytest.raises(errors.InvalidArguments):  # other actions keep refusing them
        loaded.get("billing.refund.create").validate({**VALID["billing.refund.create"], "reason": "\x1b[1m"})
