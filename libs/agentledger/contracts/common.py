"""Constrained types shared by every message and command model.

No ``from __future__ import annotations`` here or in the sibling modules: pydantic reads
these annotations at runtime.

Models are strict (``"5"`` is not an int, ``1`` is not a bool), except for UUIDs and
datetimes, which JSON can only carry as strings: they are marked ``Strict(False)`` so the
same model accepts a decoded JSON dict and a ``model_validate_json`` call alike.
"""

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Annotated, Final, Self
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    StringConstraints,
    field_validator,
    model_validator,
)

# Frozen: a message or command is a fact once built; nobody edits it in place (R2.5).
MODEL_CONFIG: Final = ConfigDict(extra="forbid", strict=True, frozen=True)


# What no text or jsonb column can hold: U+0000 (SQLSTATE 22021/22P05) and lone surrogates
# (not encodable as UTF-8). A message carrying one would be refused by the first write, after
# its checks ran; refused here, it is a typed validation error at the boundary instead.
UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")


def unstorable_path(value: object, path: str = "") -> str | None:
    """Where in a JSON-like ``value`` (strings, keys, lists, dicts) unstorable text sits."""
    if isinstance(value, str):
        return path or "<value>" if UNSTORABLE.search(value) else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = (f"{path}.<key>" if isinstance(key, str) and UNSTORABLE.search(key)
                     else unstorable_path(item, f"{path}.{key}" if path else str(key)))
            if where:
                return where
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if where := unstorable_path(item, f"{path}[{i}]"):
                return where
    return None


class Contract(BaseModel):
    """Base of every agentledger message model: unknown fields rejected, strict, frozen,
    and no text the ledger could not store (U+0000, lone surrogates)."""

    model_config = MODEL_CONFIG

    @model_validator(mode="after")
    def _storable_text(self) -> Self:
        # Nested contracts ran this check on themselves; only this model's own values here.
        for name, value in self:
            where = unstorable_path(value, name)
            if where:
                raise ValueError(f"{where}: U+0000 or a lone surrogate cannot be stored")
        return self


TenantId = Annotated[UUID, Strict(False)]
OperationId = Annotated[UUID, Strict(False)]
Uuid = Annotated[UUID, Strict(False)]
def _no_epoch_numbers(value: object) -> object:
    # Non-strict parsing would read a JSON number as Unix seconds (found by the fuzz suite:
    # `"created_at": 5` parsed as 1970); on the wire an instant is an ISO 8601 string.
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError("a timestamp is an ISO 8601 string with a timezone, not a number")
    return value


Timestamp = Annotated[AwareDatetime, Strict(False), BeforeValidator(_no_epoch_numbers)]
"""A timezone-aware instant; naive datetimes are ambiguous across services and rejected."""

PrincipalId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$"),
]
ActionName = Annotated[
    str, StringConstraints(max_length=64, pattern=r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
]
ConnectorName = Annotated[str, StringConstraints(max_length=32, pattern=r"^[a-z][a-z0-9_]*$")]
# A target in its connector's terms: a record id, a path, an e-mail address ('@', '+').
# Never a space, quote, bracket or line break: it goes into URLs and headers as it is.
ResourceId = Annotated[
    str, StringConstraints(min_length=1, max_length=128,
                           pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$")
]
# Printable ASCII without spaces: covers ETags (quotes, W/ prefix) and numeric versions.
Revision = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[!-~]+$")]
HashHex = Annotated[str, StringConstraints(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")]
VersionTag = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[!-~]+$")]
ErrorCode = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")
]
Reason = Annotated[str, StringConstraints(min_length=1, max_length=2000)]
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=200)]
ArgumentKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]

# Room for the largest allowlisted argument set (a 4,000-character note body is at most
# 16 KB of UTF-8) with margin; anything bigger is abuse, not a business request.
MAX_ARGUMENTS_BYTES: Final = 32 * 1024

Arguments = Annotated[dict[ArgumentKey, JsonValue], Field(max_length=64)]


def check_json_size(value: Mapping[str, object], *, limit: int = MAX_ARGUMENTS_BYTES) -> None:
    """Raise ``ValueError`` when a JSON object serializes to more than ``limit`` bytes."""
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > limit:
        raise ValueError(f"serialized size {size} bytes exceeds {limit}")


# --- W3C trace context (R8.2) ---------------------------------------------------------------

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_TRACESTATE_KEY = (
    r"(?:[a-z][a-z0-9_*/-]{0,255}"  # simple key
    r"|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})"  # multi-tenant key: tenant@system
)
_TRACESTATE_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_TRACESTATE_MEMBER = re.compile(rf"^{_TRACESTATE_KEY}={_TRACESTATE_VALUE}$")
_TRACESTATE_MAX_MEMBERS: Final = 32  # the W3C limit


class TraceContext(Contract):
    """W3C trace context as carried in Kafka headers (``traceparent``, ``tracestate``)."""

    traceparent: Annotated[str, StringConstraints(min_length=55, max_length=512)]
    tracestate: Annotated[str, StringConstraints(max_length=512)] | None = None

    @field_validator("traceparent")
    @classmethod
    def _check_traceparent(cls, value: str) -> str:
        match = _TRACEPARENT.fullmatch(value)
        if match is None:
            raise ValueError("traceparent is not in W3C format")
        version, trace_id, parent_id, _flags, rest = match.groups()
        if version == "ff":
            raise ValueError("traceparent version ff is invalid")
        if version == "00" and rest is not None:
            raise ValueError("traceparent version 00 has exactly four fields")
        if trace_id == "0" * 32 or parent_id == "0" * 16:
            raise ValueError("traceparent ids must not be all zeros")
        return value

    @field_validator("tracestate")
    @classmethod
    def _check_tracestate(cls, value: str | None) -> str | None:
        if value is None:
            return None
        members = [m.strip() for m in value.split(",") if m.strip()]
        if len(members) > _TRACESTATE_MAX_MEMBERS:
            raise ValueError("tracestate has more than 32 members")
        if not all(_TRACESTATE_MEMBER.fullmatch(m) for m in members):
            raise ValueError("tracestate is not in W3C format")
        return value

    @classmethod
    def from_headers(cls, headers: Mapping[str, bytes | str]) -> Self | None:
        """Read the context from message headers; ``None`` when there is no traceparent.

        Raises:
            pydantic.ValidationError: A traceparent or tracestate is present but malformed.
        """
        raw = {k.lower(): v.decode("latin-1") if isinstance(v, bytes) else v
               for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")}
        if "traceparent" not in raw:
            return None
        return cls(traceparent=raw["traceparent"], tracestate=raw.get("tracestate") or None)

    def to_headers(self) -> dict[str, bytes]:
        """The context as Kafka header values."""
        headers = {"traceparent": self.traceparent.encode()}
        if self.tracestate:
            headers["tracestate"] = self.tracestate.encode()
        return headers


# Free text kept about a decision or an outcome (a denial's reason, a provider's error, an
# operator's note) is cut to this many characters before it is stored or sent. Its source
# may be arbitrarily long (an HTML error page, a stack trace) and the ledger's text columns
# have no bound of their own; 500 keeps every stored reason inside the outcome contracts'
# ``Reason`` (2000), so a recorded reason always fits back into a message, and keeps audit
# events small. (The allowlist's refund ``reason`` argument has the same maxLength.)
REASON_MAX: Final = 500


# What stored free text never holds: what no text column can (U+0000, lone surrogates) and
# what would forge a line in a log or a terminal (every other C0 control, DEL, the C1 block).
# Tab, line feed and carriage return become spaces; the rest U+FFFD.
_UNSAFE_TEXT: Final = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_WHITESPACE: Final = frozenset("\t\n\r")


def storable_text(value: object, limit: int) -> str:
    """``value`` as text any ledger column and message can hold: controls and unstorable
    characters replaced, at most ``limit`` characters. What is cut is named by a digest of the
    whole, so two values that differ only past the bound stay different (issue 38 §1).

    For text from outside (a provider's answer, an exception's message): it never raises,
    whatever ``value`` is. It may return an empty string; callers that need text supply one.
    """
    text = value if isinstance(value, str) else repr(value)
    clean = _UNSAFE_TEXT.sub(lambda m: " " if m.group() in _WHITESPACE else "\ufffd", text)
    if len(clean) <= limit:
        return clean
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    tail = f"…[cut, sha256:{digest}]"
    return clean[:max(limit - len(tail), 0)] + tail[:limit]


def reason_text(text: object) -> str:
    """``text`` as the ledger keeps reasons: storable, at most :data:`REASON_MAX` characters."""
    return storable_text(text, REASON_MAX)
