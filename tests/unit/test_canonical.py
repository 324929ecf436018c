"""The request hash binds exactly tenant, principal, action, target, arguments, revision (R2.2)."""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentledger import canonical, errors

# No example database: unit tests write nothing outside tmp dirs.
unit = settings(database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SAFE_INT = 2**53 - 1

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE_INT, max_value=SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
arguments_st = st.dictionaries(st.text(max_size=12), json_values, max_size=6)
revision_st = st.none() | st.text(max_size=10)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "tenant_id": draw(st.uuids()),
        "principal_id": draw(st.text(min_size=1, max_size=20)),
        "action": draw(st.text(min_size=1, max_size=20)),
        "target": draw(st.text(min_size=1, max_size=20)),
        "arguments": draw(arguments_st),
        "expected_revision": draw(revision_st),
    }


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _canon(value: Any) -> bytes:
    return canonical.canonical_bytes(value)


@unit
@given(requests(), st.randoms(use_true_random=False))
def test_key_order_never_changes_the_hash(req: dict[str, Any], rng: random.Random) -> None:
    reordered = dict(req, arguments=_shuffled(req["arguments"], rng))
    assert canonical.request_hash(**reordered) == canonical.request_hash(**req)


@unit
@given(
    requests(),
    st.sampled_from([None, 0, 2, "\t"]),
    st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :  ")]),
    st.booleans(),
    st.booleans(),
)
def test_json_formatting_never_changes_the_hash(
    req: dict[str, Any], indent: int | str | None, separators: tuple[str, str],
    ensure_ascii: bool, sort_keys: bool,
) -> None:
    text = json.dumps(req["arguments"], indent=indent, separators=separators,
                      ensure_ascii=ensure_ascii, sort_keys=sort_keys)
    reparsed = dict(req, arguments=json.loads(text))
    assert canonical.request_hash(**reparsed) == canonical.request_hash(**req)


@unit
@given(requests())
def test_tenant_spelling_never_changes_the_hash(req: dict[str, Any]) -> None:
    as_upper_text = dict(req, tenant_id=str(req["tenant_id"]).upper())
    assert canonical.request_hash(**as_upper_text) == canonical.request_hash(**req)


@unit
@given(requests(), st.data())
def test_changing_any_bound_field_changes_the_hash(req: dict[str, Any], data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(
        ["tenant_id", "principal_id", "action", "target", "expected_revision",
         "argument_value", "argument_key", "argument_added", "argument_removed"]))
    changed = dict(req, arguments=dict(req["arguments"]))
    args = changed["arguments"]
    if field == "tenant_id":
        changed["tenant_id"] = data.draw(st.uuids().filter(lambda u: u != req["tenant_id"]))
    elif field in ("principal_id", "action", "target"):
        changed[field] = data.draw(st.text(min_size=1, max_size=20).filter(
            lambda t: t != req[field]))
    elif field == "expected_revision":
        changed[field] = data.draw(revision_st.filter(lambda r: r != req[field]))
    elif field == "argument_added":
        key = data.draw(st.text(max_size=12).filter(lambda k: k not in args))
        args[key] = data.draw(json_values)
    else:
        assume(args)
        key = data.draw(st.sampled_from(sorted(args)))
        if field == "argument_value":
            value = data.draw(json_values)
            # 1 and 1.0 are the same JSON number; a "change" must change the JSON value.
            assume(_canon(value) != _canon(args[key]))
            args[key] = value
        elif field == "argument_key":
            new_key = data.draw(st.text(max_size=12).filter(lambda k: k not in args))
            args[new_key] = args.pop(key)
        else:
            del args[key]
    assert canonical.request_hash(**changed) != canonical.request_hash(**req)


def test_none_and_empty_revision_differ() -> None:
    base: dict[str, Any] = {"tenant_id": uuid.uuid4(), "principal_id": "u",
                            "action": "crm.note.create", "target": "c1", "arguments": {}}
    assert (canonical.request_hash(**base, expected_revision=None)
            != canonical.request_hash(**base, expected_revision=""))


def test_known_vector() -> None:
    """Pins the exact bytes: a change here breaks replay detection of stored commands."""
    tenant = uuid.UUID("00000000-0000-4000-8000-000000000001")
    body = canonical.canonical_bytes({
        "tenant_id": str(tenant), "principal_id": "user:1", "action": "crm.note.create",
        "target": "c1", "arguments": {"z": 1, "a": "é"}, "expected_revision": None,
    })
    assert body == ('{"action":"crm.note.create","arguments":{"a":"é","z":1},'
                    '"expected_revision":null,"principal_id":"user:1","target":"c1",'
                    '"tenant_id":"00000000-0000-4000-8000-000000000001"}').encode()
    digest = canonical.request_hash(tenant_id=tenant, principal_id="user:1",
                                    action="crm.note.create", target="c1",
                                    arguments={"z": 1, "a": "é"}, expected_revision=None)
    assert len(digest) == 32
    assert canonical.hash_hex(digest) == digest.hex()
    assert len(canonical.hash_hex(digest)) == 64


@pytest.mark.parametrize("value", [{"x": float("nan")}, {"x": 2**60}, {1: "a"}, {"x": {1, 2}}])
def test_values_without_canonical_form_are_refused(value: object) -> None:
    with pytest.raises(errors.ValidationFailed):
        canonical.canonical_bytes(value)


def test_tenant_must_be_a_uuid() -> None:
    with pytest.raises(errors.ValidationFailed, match="tenant_id"):
        canonical.request_hash(tenant_id="acme", principal_id="u", action="a.b", target="t",
                               arguments={}, expected_revision=None)
