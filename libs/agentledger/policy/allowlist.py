"""The versioned action allowlist: which actions exist and their closed argument schemas.

R1.2/R1.3: a model may only propose an action on this list, with arguments that satisfy a
closed schema (no unknown properties, explicit max lengths, strict types). The version is
the SHA-256 of the file's RFC 8785 canonical form, so reformatting the file or reordering
its keys never changes it, and any change of content always does.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

import jsonschema
import jsonschema.validators
from jsonschema import Draft202012Validator

from agentledger import canonical, errors, settings
from agentledger.policy import narrowing

DEFAULT_PATH: Final = Path(__file__).with_name("allowlist.json")
FILE_FORMAT: Final = "agentledger.allowlist.v1"

Risk = Literal["low", "medium", "high"]

# Enough to fix a proposal; a flood of violations only helps someone probe the schema.
MAX_VIOLATIONS: Final = 20
# Property names and paths come from the caller; cut them so an error never echoes a payload.
_MAX_NAME_CHARS: Final = 64
# Characters no argument carries unless its action declares `allows_control_characters`: C0
# controls but tab, newline and carriage return, DEL and C1 controls (a terminal reads some
# as commands), and the bidirectional overrides and isolates that make text shown to an
# approver read differently from what is stored (U+202A-202E, U+2066-2069).
_CONTROL: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _strict_integer(_checker: object, instance: object) -> bool:
    # JSON Schema counts 5.0 as an integer; we don't: the payload must keep its exact type.
    return isinstance(instance, int) and not isinstance(instance, bool)


# types-jsonschema leaves extend() unannotated.
_StrictValidator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
)

_FILE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["format", "actions"],
    "properties": {
        "format": {"const": FILE_FORMAT},
        "actions": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "connector", "risk", "requires_revision", "description",
                             "arguments"],
                "properties": {
                    "name": {"type": "string", "maxLength": 64,
                             "pattern": r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$"},
                    "connector": {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,31}$"},
                    "risk": {"enum": ["low", "medium", "high"]},
                    "requires_revision": {"type": "boolean"},
                    "allows_control_characters": {"type": "boolean"},
                    "description": {"type": "string", "minLength": 1, "maxLength": 1000},
                    "arguments": {"type": "object"},
                    # Which arguments an approver may narrow, and how (issue 42;
                    # agentledger.policy.narrowing checks them against the schema).
                    "narrowable": {"type": "object", "maxProperties": 32,
                                   "additionalProperties": {"enum": list(narrowing.KINDS)}},
                },
            },
        },
    },
}

# Keywords a closed schema may use. Anything else (anyOf, $ref, patternProperties, ...) could
# open a hole the closedness check cannot see, so the loader refuses it.
_ALLOWED_KEYWORDS: Final = frozenset({
    "$schema", "type", "description", "title", "properties", "required",
    "additionalProperties", "minProperties", "maxProperties", "minLength", "maxLength",
    "pattern", "format", "enum", "const", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "items", "minItems", "maxItems", "uniqueItems",
})
_TYPES: Final = frozenset({"object", "string", "integer", "number", "boolean", "array"})


def _closedness_problems(node: object, where: str) -> Iterator[str]:
    """Every reason the schema at ``where`` is not closed and bounded."""
    here = where or "/"
    if not isinstance(node, dict):
        yield f"{here}: a schema must be an object"
        return
    unknown = sorted(set(node) - _ALLOWED_KEYWORDS)
    if unknown:
        yield f"{here}: keywords not allowed in a closed schema: {', '.join(unknown)}"
    kind = node.get("type")
    if kind not in _TYPES:
        yield f"{here}: needs a single 'type' among {', '.join(sorted(_TYPES))}"
        return
    if kind == "object":
        if node.get("additionalProperties") is not False:
            yield f"{here}: object without additionalProperties: false"
        props = node.get("properties")
        if not isinstance(props, dict) or not props:
            yield f"{here}: object without properties"
            return
        for name, sub in props.items():
            yield from _closedness_problems(sub, f"{where}/properties/{name}")
        missing = set(node.get("required", [])) - set(props)
        if missing:
            yield f"{here}: required names undeclared properties {sorted(missing)}"
    elif kind == "string" and not isinstance(node.get("maxLength"), int):
        yield f"{here}: string without maxLength"
    elif kind in ("integer", "number"):
        if "minimum" not in node and "exclusiveMinimum" not in node:
            yield f"{here}: {kind} without a lower bound"
        if "maximum" not in node and "exclusiveMaximum" not in node:
            yield f"{here}: {kind} without an upper bound"
    elif kind == "array":
        if not isinstance(node.get("maxItems"), int):
            yield f"{here}: array without maxItems"
        yield from _closedness_problems(node.get("items"), f"{where}/items")


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_NAME_CHARS else text[:_MAX_NAME_CHARS] + "…"


def _describe(error: jsonschema.ValidationError) -> str:
    """A message for one violation that never quotes the offending value."""
    keyword = error.validator
    bound: Any = error.validator_value
    instance: Any = error.instance
    if keyword == "type":
        return f"must be of type {bound}"
    if keyword == "maxLength":
        return f"longer than {bound} characters"
    if keyword == "minLength":
        return f"shorter than {bound} characters"
    if keyword in ("minimum", "exclusiveMinimum"):
        return f"must be {'>=' if keyword == 'minimum' else '>'} {bound}"
    if keyword in ("maximum", "exclusiveMaximum"):
        return f"must be {'<=' if keyword == 'maximum' else '<'} {bound}"
    if keyword == "enum":
        return "must be one of " + ", ".join(str(v) for v in bound)
    if keyword == "const":
        return "has a value that is not allowed"
    if keyword == "pattern":
        return "does not match the required pattern"
    if keyword == "format":
        return f"is not a valid {bound}"
    if keyword == "required":
        missing = [n for n in bound if isinstance(instance, dict) and n not in instance]
        return "missing required properties: " + ", ".join(missing)
    if keyword == "additionalProperties":
        declared = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extra = sorted(str(k) for k in instance if k not in declared) if isinstance(
            instance, dict) else []
        shown = ", ".join(_cut(k) for k in extra[:5]) + (", …" if len(extra) > 5 else "")
        return f"unknown properties: {shown}"
    if keyword == "minProperties":
        return f"must have at least {bound} properties"
    if keyword == "maxProperties":
        return f"must have at most {bound} properties"
    return f"violates {keyword}"


def _control_paths(value: object, path: str) -> Iterator[str]:
    """JSON pointers (cut like every caller-given name) of the strings holding `_CONTROL`."""
    if isinstance(value, str):
        if _CONTROL.search(value):
            yield path or "/"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _control_paths(item, f"{path}/{_cut(str(key))}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _control_paths(item, f"{path}/{i}")


def _pointer(error: jsonschema.ValidationError) -> str:
    return "/" + "/".join(_cut(str(part)) for part in error.absolute_path)


@dataclass(frozen=True)
class ActionSpec:
    """One allowlisted action.

    Attributes:
        name: The action name, e.g. ``crm.note.create``.
        connector: The connector that executes it.
        risk: ``low``, ``medium`` or ``high``; policy uses it to decide on approval (R2.9).
        requires_revision: Whether a proposal must carry the target's expected revision,
            sent as a precondition at dispatch (R2.7).
        allows_control_characters: Whether its string arguments may hold control and
            bidirectional formatting characters (refused by default).
        description: What the action does, for planners and the approval console.
        schema: The closed JSON Schema of its arguments.
        allowlist_version: The version of the allowlist this spec comes from.
        narrowable: The arguments an approver may narrow and how (``decrease``, ``subset``;
            ``agentledger.policy.narrowing``); empty: none.
    """

    name: str
    connector: str
    risk: Risk
    requires_revision: bool
    description: str
    schema: Mapping[str, Any]
    allowlist_version: str
    _validator: Any = field(repr=False, compare=False)
    allows_control_characters: bool = False
    narrowable: Mapping[str, narrowing.How] = field(
        default_factory=lambda: types.MappingProxyType({}))

    def validate(self, arguments: Mapping[str, object]) -> dict[str, Any]:
        """Check arguments against the closed schema (Draft 2020-12, formats asserted).

        Args:
            arguments: The proposed arguments.

        Returns:
            A deep copy of the arguments, safe to persist.

        Raises:
            errors.InvalidArguments: With ``details["violations"]``: up to ``MAX_VIOLATIONS``
                ``{"path", "message"}`` entries that never echo the submitted values.
        """
        found = sorted(self._validator.iter_errors(arguments),
                       key=lambda e: [str(part) for part in e.path])
        controls = [] if self.allows_control_characters else list(_control_paths(arguments, ""))
        if found or controls:
            # jsonschema reports each missing required property separately, all described
            # by one message here; keep one copy of each.
            unique = {(_pointer(e), _describe(e)): None for e in found}
            unique |= {(path, "holds a control or bidirectional formatting character"): None
                       for path in controls}
            violations = [{"path": path, "message": message}
                          for path, message in list(unique)[:MAX_VIOLATIONS]]
            raise errors.InvalidArguments(
                f"arguments of {self.name} violate its schema "
                f"({len(unique)} violation{'s' if len(unique) > 1 else ''})",
                action=self.name,
                allowlist_version=self.allowlist_version,
                violations=violations,
                truncated=len(unique) > MAX_VIOLATIONS,
            )
        return copy.deepcopy(dict(arguments))

    def check_revision(self, expected_revision: str | None) -> None:
        """Refuse a proposal without expected revision for an action that requires one.

        Raises:
            errors.InvalidArguments: ``requires_revision`` and no revision was given.
        """
        if self.requires_revision and not expected_revision:
            raise errors.InvalidArguments(
                f"{self.name} is conditional on the record revision: expected_revision is "
                "required",
                action=self.name,
                allowlist_version=self.allowlist_version,
                violations=[{"path": "/expected_revision", "message": "required"}],
            )

    def tool_schema(self) -> dict[str, Any]:
        """An OpenAI-style function tool definition for planners (R9.4)."""
        return {
            "type": "function",
            "function": {
                "name": self.name.replace(".", "_"),
                "description": self.description,
                "parameters": copy.deepcopy(dict(self.schema)),
            },
        }


@dataclass(frozen=True)
class Allowlist:
    """A loaded, validated allowlist.

    Attributes:
        version: ``"sha256:"`` + hex SHA-256 of the canonical form of the file.
        actions: The actions by name.
    """

    version: str
    actions: Mapping[str, ActionSpec]

    @classmethod
    def load(cls, path: Path | str | None = None) -> Allowlist:
        """Read and validate an allowlist file (default: ``AGENTLEDGER_ALLOWLIST``, else the
        one shipped with the package, the demo's).

        Raises:
            errors.ValidationFailed: The file is not valid JSON, not a valid allowlist, or
                one of its argument schemas is not closed and bounded.
        """
        source = Path(path) if path is not None else (
            settings.PolicySources().allowlist or DEFAULT_PATH)
        try:
            document = json.loads(source.read_bytes())
        except (OSError, ValueError) as exc:
            raise errors.ValidationFailed(
                f"allowlist {source} cannot be read as JSON: {exc}"
            ) from exc
        return cls.from_document(document, source=str(source))

    @classmethod
    def from_document(cls, document: object, *, source: str = "<document>") -> Allowlist:
        """Validate a parsed allowlist document (see ``load``)."""
        problems = [f"{_pointer(e)}: {e.message}"[:300]
                    for e in Draft202012Validator(_FILE_SCHEMA).iter_errors(document)]
        if problems:
            raise errors.ValidationFailed(
                f"allowlist {source} is malformed: {'; '.join(problems[:10])}")
        document = cast(dict[str, Any], document)
        version = "sha256:" + hashlib.sha256(canonical.canonical_bytes(document)).hexdigest()
        actions: dict[str, ActionSpec] = {}
        for entry in document["actions"]:
            name = entry["name"]
            if name in actions:
                raise errors.ValidationFailed(f"allowlist {source}: duplicate action {name}")
            schema = entry["arguments"]
            try:
                _StrictValidator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise errors.ValidationFailed(
                    f"allowlist {source}: {name}: invalid JSON Schema: {exc.message}") from exc
            problems = list(_closedness_problems(schema, ""))
            if problems:
                raise errors.ValidationFailed(
                    f"allowlist {source}: {name}: schema is not closed: {'; '.join(problems)}")
            narrowable = entry.get("narrowable", {})
            problems = narrowing.declaration_problems(name, schema, narrowable)
            if problems:
                raise errors.ValidationFailed(f"allowlist {source}: {'; '.join(problems)}")
            frozen_schema = copy.deepcopy(schema)
            actions[name] = ActionSpec(
                name=name,
                connector=entry["connector"],
                risk=entry["risk"],
                requires_revision=entry["requires_revision"],
                allows_control_characters=entry.get("allows_control_characters", False),
                description=entry["description"],
                schema=types.MappingProxyType(frozen_schema),
                narrowable=types.MappingProxyType(dict(narrowable)),
                allowlist_version=version,
                _validator=_StrictValidator(
                    frozen_schema, format_checker=Draft202012Validator.FORMAT_CHECKER),
            )
        return cls(version=version, actions=types.MappingProxyType(actions))

    def get(self, name: str) -> ActionSpec:
        """The spec of an allowlisted action.

        Raises:
            errors.UnknownAction: The action is not on this version of the allowlist.
        """
        spec = self.actions.get(name)
        if spec is None:
            raise errors.UnknownAction(
                f"action {_cut(name)!r} is not on allowlist {self.version}",
                action=_cut(name),
                allowlist_version=self.version,
            )
        return spec

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Tool definitions of every action, sorted by name."""
        return [self.actions[n].tool_schema() for n in sorted(self.actions)]
