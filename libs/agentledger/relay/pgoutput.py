"""Decoder for PostgreSQL's built-in ``pgoutput`` logical replication protocol (version 1).

Why our own: the PyPI ``pypgoutput`` decoder is unmaintained, and the relay needs only a
small, fully tested subset: Begin, Commit, Relation and Insert with text-format tuples.
Every other message kind (Origin, Type, Truncate, Update, Delete, logical Message) is
recognised and returned as :class:`Skipped`, so a change in what the publication sends
never crashes the relay. Wire format: PostgreSQL docs, "Logical Replication Message Formats".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from agentledger import errors

# pgoutput timestamps count microseconds from 2000-01-01 00:00:00 UTC.
PG_EPOCH_UNIX_SECONDS = 946_684_800


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction starts; ``final_lsn`` is the LSN of its commit record."""

    final_lsn: int
    commit_time_us: int  # microseconds since the PostgreSQL epoch
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    """A transaction ends; confirming ``end_lsn`` tells the slot it never needs it again."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a relation as the publisher describes it."""

    name: str
    type_oid: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    """The shape of a table; sent before the first change to it in each session."""

    oid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class Insert:
    """A new row, as text values (``None`` for SQL NULL) in the relation's column order."""

    relation_oid: int
    values: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Skipped:
    """A message the relay does not act on; ``kind`` is its one-letter tag."""

    kind: str


Message = Begin | Commit | Relation | Insert | Skipped

# Tags the relay tolerates without acting on them: Origin, Type, Truncate, Update, Delete,
# logical decoding Message.
_SKIPPED = frozenset(b"OYTUDM")


def unix_seconds(pg_time_us: int) -> float:
    """Convert a pgoutput timestamp to seconds since the Unix epoch."""
    return PG_EPOCH_UNIX_SECONDS + pg_time_us / 1_000_000


class _Reader:
    __slots__ = ("_buf", "_pos")

    def __init__(self, buf: bytes) -> None:
        self._buf = buf
        self._pos = 1  # past the tag

    def _take(self, size: int) -> bytes:
        end = self._pos + size
        if end > len(self._buf):
            raise errors.DecodeError(
                "pgoutput message truncated", need=end, have=len(self._buf)
            )
        chunk = self._buf[self._pos:end]
        self._pos = end
        return chunk

    def int8(self) -> int:
        return int(struct.unpack("!b", self._take(1))[0])

    def byte(self) -> str:
        return self._take(1).decode("ascii")

    def int16(self) -> int:
        return int(struct.unpack("!h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack("!i", self._take(4))[0])

    def uint32(self) -> int:
        return int(struct.unpack("!I", self._take(4))[0])

    def string(self) -> str:
        end = self._buf.find(b"\x00", self._pos)
        if end < 0:
            raise errors.DecodeError("pgoutput string not terminated")
        text = self._buf[self._pos:end].decode("utf-8")
        self._pos = end + 1
        return text


# Fixed layouts of the messages every transaction sends, unpacked in one call each (the
# relay decodes Begin, Insert and Commit per row or per transaction: its hot loop).
_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!bQQq")
_INSERT_HEAD = struct.Struct("!Ic")  # relation oid, 'N' (a new tuple follows)
_COUNT = struct.Struct("!h")
_LENGTH = struct.Struct("!i")
_B, _C, _I = ord("B"), ord("C"), ord("I")
_NULL, _TEXT, _UNCHANGED = ord("n"), ord("t"), ord("u")


def _truncated(need: int, have: int) -> errors.DecodeError:
    return errors.DecodeError("pgoutput message truncated", need=need, have=have)


def _insert(payload: bytes) -> Insert:
    size = len(payload)
    if size < 1 + _INSERT_HEAD.size:
        raise _truncated(1 + _INSERT_HEAD.size, size)
    oid, marker = _INSERT_HEAD.unpack_from(payload, 1)
    if marker != b"N":
        raise errors.DecodeError("insert without a new tuple", marker=marker.decode("latin-1"))
    pos = 1 + _INSERT_HEAD.size
    if pos + 2 > size:
        raise _truncated(pos + 2, size)
    count = _COUNT.unpack_from(payload, pos)[0]
    pos += 2
    values: list[str | None] = []
    append = values.append
    for _ in range(count):
        if pos >= size:
            raise _truncated(pos + 1, size)
        kind = payload[pos]
        pos += 1
        if kind == _TEXT:
            if pos + 4 > size:
                raise _truncated(pos + 4, size)
            length = _LENGTH.unpack_from(payload, pos)[0]
            pos += 4
            end = pos + length
            if length < 0 or end > size:
                raise _truncated(end, size)
            append(payload[pos:end].decode("utf-8"))
            pos = end
        elif kind == _NULL:
            append(None)
        elif kind == _UNCHANGED:
            # An unchanged TOASTed value exists only in updates, which the relay skips.
            raise errors.DecodeError("unchanged TOAST value in an insert")
        else:
            # 'b' (binary) is sent only when the `binary` option is requested; we never do.
            raise errors.DecodeError("unsupported tuple value format", format=chr(kind))
    return Insert(relation_oid=oid, values=tuple(values))


def decode(payload: bytes) -> Message:
    """Decode one pgoutput message (the payload of one XLogData message).

    Raises:
        DecodeError: the bytes are not a well-formed protocol-1 message of a known kind.
    """
    if not payload:
        raise errors.DecodeError("empty pgoutput message")
    tag = payload[0]
    if tag == _I:
        return _insert(payload)
    if tag == _B:
        if len(payload) < 1 + _BEGIN.size:
            raise _truncated(1 + _BEGIN.size, len(payload))
        final_lsn, commit_time_us, xid = _BEGIN.unpack_from(payload, 1)
        return Begin(final_lsn=final_lsn, commit_time_us=commit_time_us, xid=xid)
    if tag == _C:
        if len(payload) < 1 + _COMMIT.size:
            raise _truncated(1 + _COMMIT.size, len(payload))
        flags, commit_lsn, end_lsn, commit_time_us = _COMMIT.unpack_from(payload, 1)
        return Commit(flags=flags, commit_lsn=commit_lsn, end_lsn=end_lsn,
                      commit_time_us=commit_time_us)
    reader = _Reader(payload)
    if tag == ord("R"):
        oid = reader.uint32()
        namespace = reader.string()
        name = reader.string()
        identity = reader.byte()
        columns = []
        for _ in range(reader.int16()):
            flags = reader.int8()
            col_name = reader.string()
            type_oid = reader.uint32()
            reader.int32()  # atttypmod: irrelevant to text values
            columns.append(Column(name=col_name, type_oid=type_oid, is_key=bool(flags & 1)))
        return Relation(oid, namespace or "pg_catalog", name, identity, tuple(columns))
    if tag in _SKIPPED:
        return Skipped(chr(tag))
    raise errors.DecodeError("unknown pgoutput message", tag=chr(tag))
