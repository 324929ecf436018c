"""Narrow-only edits: which arguments of an action an approver may narrow, and how (issue 42).

An action declares them in the allowlist, beside its argument schema::

    {"name": "billing.refund.create", ..., "narrowable": {"amount_minor": "decrease"}}

- ``decrease``: an integer (or number) argument may be lowered, never raised;
- ``subset``: an array argument may lose items, never gain one (the narrowed list is the
  original with items left out, in the original's order).

Everything else about the command is fixed: any other argument changed, added or removed is a
widening as far as this module is concerned, and refused. The narrowed arguments must still
satisfy the action's schema (its minimum, its ``minItems``): the caller validates them first.

This module is pure (no I/O) so the allowlist loader, ``check-config`` and the approval path
share one reading of a declaration; ``agentledger.approvals.narrowing`` runs the edit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Final, Literal

from agentledger import canonical, errors

How = Literal["decrease", "subset"]
KINDS: Final[tuple[How, ...]] = ("decrease", "subset")
# The argument types each kind applies to, as the closed schema declares them.
_TYPES: Final[Mapping[str, tuple[str, ...]]] = {"decrease": ("integer", "number"),
                                                 "subset": ("array",)}
# Field names are the schema's own (declared), but a malformed file may name anything: cut.
_MAX_NAME: Final = 64


def _cut(name: str) -> str:
    return name if len(name) <= _MAX_NAME else name[:_MAX_NAME] + "…"


def declaration_problems(action: str, schema: Mapping[str, Any],
                         narrowable: Mapping[str, Any]) -> list[str]:
    """Every reason an action's ``narrowable`` declaration cannot work with its schema.

    Returns messages like ``billing.refund.create: narrow rule currency: decrease needs an
    integer or number argument, currency is string`` (empty: usable).
    """
    found: list[str] = []
    properties = schema.get("properties", {})
    for field, how in sorted(narrowable.items()):
        where = f"{action}: narrow rule {_cut(str(field))}"
        if how not in KINDS:
            found.append(f"{where}: unknown kind {str(how)[:32]!r} (one of {', '.join(KINDS)})")
            continue
        prop = properties.get(field) if isinstance(properties, Mapping) else None
        if not isinstance(prop, Mapping):
            found.append(f"{where}: {action} has no argument {_cut(str(field))}")
            continue
        kind = prop.get("type")
        wanted = _TYPES[how]
        if kind not in wanted:
            found.append(f"{where}: {how} needs an {' or '.join(wanted)} argument, "
                         f"{_cut(str(field))} is {kind}")
        elif how == "decrease" and not _floored(prop):
            # Without a floor at zero, "lower" reaches past zero: a -10,000 refund is a larger
            # effect the other way, not a narrower one.
            found.append(f"{where}: decrease needs a minimum of 0 or more on "
                         f"{_cut(str(field))} (its schema has none)")
    return found


def _floored(prop: Mapping[str, Any]) -> bool:
    low = prop.get("minimum", prop.get("exclusiveMinimum"))
    return isinstance(low, int | float) and not isinstance(low, bool) and low >= 0


def _refused(action: str, message: str, field: str | None = None) -> errors.NarrowingRefused:
    return errors.NarrowingRefused(f"{action}: {message}", action=action,
                                   **({"field": _cut(field)} if field is not None else {}))


def _in_order(before: list[Any], after: list[Any]) -> bool:
    """Whether ``after`` is ``before`` with items left out (a subsequence)."""
    rest = iter(canonical.canonical_bytes(v) for v in before)
    return all(any(b == a for b in rest) for a in (canonical.canonical_bytes(v) for v in after))


def check(action: str, narrowable: Mapping[str, str], original: Mapping[str, Any],
          narrowed: Mapping[str, Any]) -> list[str]:
    """Whether ``narrowed`` only narrows ``original`` as the action declares (pure).

    Both argument sets must already satisfy the action's schema.

    Returns:
        The fields that narrowed, sorted (at least one).

    Raises:
        NarrowingRefused: a field changed that is not declared narrowable (or was added or
            removed), a ``decrease`` field grew, a ``subset`` field gained an item, or
            nothing narrowed at all. Nothing names a submitted value.
    """
    changed: list[str] = []
    for field in sorted(set(original) | set(narrowed)):
        if field not in original or field not in narrowed:
            raise _refused(action, f"{_cut(field)} may not be added or removed by a narrowing",
                           field)
        before, after = original[field], narrowed[field]
        if canonical.canonical_bytes(before) == canonical.canonical_bytes(after):
            continue
        how = narrowable.get(field)
        if how is None:
            raise _refused(action, f"{_cut(field)} is not declared narrowable; only "
                           f"{', '.join(sorted(narrowable)) or 'no field'} may narrow", field)
        if how == "decrease":
            numeric = (int, float)
            if (isinstance(before, bool) or isinstance(after, bool)
                    or not isinstance(before, numeric) or not isinstance(after, numeric)):
                raise _refused(action, f"{field} is not a number", field)
            if after > before:
                raise _refused(action, f"{field} may only decrease; a larger value widens "
                               "the command", field)
        elif how == "subset":
            if not isinstance(before, list) or not isinstance(after, list):
                raise _refused(action, f"{field} is not a list", field)
            kept = Counter(canonical.canonical_bytes(v) for v in after)
            had = Counter(canonical.canonical_bytes(v) for v in before)
            if kept - had:
                raise _refused(action, f"{field} may only lose items; an item that was not "
                               "proposed widens the command", field)
            if not _in_order(before, after):
                raise _refused(action, f"{field} must keep the proposed order", field)
        else:  # unreachable: the allowlist loader refuses any other kind
            raise _refused(action, f"{field} has an unknown narrow rule", field)
        changed.append(field)
    if not changed:
        raise _refused(action, "nothing was narrowed; approve the request as it is instead")
    return changed
