"""``*.dlq.v1``: a message that could not be processed, kept for inspection and replay.

The raw bytes travel base64-encoded so nothing is lost to decoding, but bounded: a
dead-letter record must itself always fit in a Kafka message. Of a topic that carries
payloads (arguments, goals, evidence, identity envelopes) only the coordinates, size and
SHA-256 are kept (``value_kept=False``): the bytes stay on the source topic for its retention,
and a DLQ kept for 30 days holds no plaintext payload (R3.6, issue 17).
"""

import base64
import hashlib
from datetime import datetime
from typing import Annotated, Final, Literal, Self

from pydantic import Field, StringConstraints

from agentledger import errors
from agentledger.contracts import common

# Enough to diagnose any legitimate message (proposals are bounded far below this) while
# the whole record stays well under Kafka's default 1 MiB message limit.
MAX_VALUE_BYTES: Final = 64 * 1024
MAX_KEY_CHARS: Final = 512
MAX_REASON_CHARS: Final = 2000
# 384 raw bytes are exactly 512 base64 characters.
_MAX_KEY_BYTES_B64: Final = MAX_KEY_CHARS // 4 * 3

TopicName = Annotated[
    str, StringConstraints(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")
]


def _b64len(raw: int) -> int:
    return 4 * -(-raw // 3)


class DeadLetterV1(common.Contract):
    """One poison message and why it was set aside.

    Attributes:
        key: The message key, as text when it is UTF-8 (``key_encoding="utf8"``), otherwise
            base64 of its bytes; ``None`` for a message without key.
        value_b64: Base64 of the raw value, cut to ``MAX_VALUE_BYTES`` (``value_truncated``).
        value_size: The size of the original value in bytes.
        value_sha256: The SHA-256 of the whole original value (hex), to find it on the source
            topic at ``partition``/``offset``.
        value_kept: False when the value was deliberately not copied (a payload topic);
            ``value_b64`` is then empty.
        error_code: The ``errors.AgentLedgerError.code`` that classified the failure.
    """

    source_topic: TopicName
    partition: Annotated[int, Field(ge=0)]
    offset: Annotated[int, Field(ge=0)]
    key: Annotated[str, StringConstraints(max_length=MAX_KEY_CHARS)] | None = None
    key_encoding: Literal["utf8", "base64"] = "utf8"
    key_truncated: bool = False
    value_b64: Annotated[str, StringConstraints(max_length=_b64len(MAX_VALUE_BYTES))]
    value_truncated: bool = False
    value_size: Annotated[int, Field(ge=0)]
    value_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    value_kept: bool = True
    error_code: common.ErrorCode
    reason: Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON_CHARS)]
    failed_at: common.Timestamp

    @classmethod
    def from_raw(
        cls,
        *,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        error: errors.AgentLedgerError,
        failed_at: datetime,
        keep_value: bool = True,
    ) -> Self:
        """Build the record for a raw Kafka message, encoding and bounding its bytes.

        Args:
            topic: The topic the message was read from.
            partition: Its partition.
            offset: Its offset.
            key: The raw key.
            value: The raw value (``None`` for a tombstone).
            error: Why it could not be processed; only its code and message are kept.
            failed_at: When processing gave up.
            keep_value: Copy the value's bytes (False for topics that carry payloads).
        """
        text_key: str | None = None
        encoding: Literal["utf8", "base64"] = "utf8"
        key_truncated = False
        if key is not None:
            try:
                text_key = key.decode("utf-8")
            except UnicodeDecodeError:
                text_key = None
            # A key the ledger could not store as text travels as bytes: the dead-letter
            # record must always build, or the poison message would stall its partition.
            if (text_key is None or len(text_key) > MAX_KEY_CHARS
                    or common.UNSTORABLE.search(text_key)):
                encoding = "base64"
                key_truncated = len(key) > _MAX_KEY_BYTES_B64
                text_key = base64.b64encode(key[:_MAX_KEY_BYTES_B64]).decode("ascii")
        raw = value or b""
        return cls(
            source_topic=topic,
            partition=partition,
            offset=offset,
            key=text_key,
            key_encoding=encoding,
            key_truncated=key_truncated,
            value_b64=base64.b64encode(raw[:MAX_VALUE_BYTES]).decode("ascii") if keep_value else "",
            value_truncated=keep_value and len(raw) > MAX_VALUE_BYTES,
            value_size=len(raw),
            value_sha256=hashlib.sha256(raw).hexdigest(),
            value_kept=keep_value,
            error_code=error.code,
            reason=common.UNSTORABLE.sub("\ufffd", error.message or error.code)[:MAX_REASON_CHARS],
            failed_at=failed_at,
        )

    def key_bytes(self) -> bytes | None:
        """The original key bytes (a prefix of them when ``key_truncated``)."""
        if self.key is None:
            return None
        return base64.b64decode(self.key) if self.key_encoding == "base64" else self.key.encode()

    def value_bytes(self) -> bytes:
        """The original value bytes (a prefix of them when ``value_truncated``; empty when
        not ``value_kept``)."""
        return base64.b64decode(self.value_b64)
