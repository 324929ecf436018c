"""The console's narrow form, turned into the narrowed arguments (issue 42).

A shell's translation only: the form sends, per narrowable field, ``narrow.<field>`` — the
new number of a ``decrease`` field, or the indexes of the items kept of a ``subset`` field —
and every other argument is the original's. Whether the result only narrows is
``agentledger.policy.narrowing``'s to say (through ``approvals.narrowing.narrow``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from agentledger import errors

PREFIX: Final = "narrow."
# A list a closed schema bounds (maxItems) is short; an index beyond this is not a form's.
_MAX_INDEX: Final = 10_000


def _refused(field: str, message: str) -> errors.InvalidArguments:
    return errors.InvalidArguments(
        f"the narrowed {field} {message}",
        violations=[{"path": f"/{field}", "message": message}])


def arguments(original: Mapping[str, Any] | None, narrowable: Mapping[str, str],
              form: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The original arguments with each narrowable field as the form sets it.

    Raises:
        DecryptionFailed: the original arguments cannot be read.
        InvalidArguments: a value is not a number, or an index is not one of the list's.
    """
    if original is None:
        raise errors.DecryptionFailed("the proposed arguments cannot be read")
    out = dict(original)
    for field, how in narrowable.items():
        sent = form.get(PREFIX + field)
        if sent is None or field not in original:
            continue
        if how == "decrease":
            raw = sent[0].strip() if sent else ""
            try:
                value: Any = int(raw) if isinstance(original[field], int) else float(raw)
            except ValueError:
                raise _refused(field, "is not a number") from None
            out[field] = value
        elif how == "subset" and isinstance(original[field], list):
            items = original[field]
            try:
                kept = sorted({int(i) for i in sent if i.strip()})
            except ValueError:
                raise _refused(field, "names an item that is not in the list") from None
            if any(i < 0 or i >= min(len(items), _MAX_INDEX) for i in kept):
                raise _refused(field, "names an item that is not in the list")
            out[field] = [items[i] for i in kept]
    return out
