"""The pgoutput decoder against bytes captured from PostgreSQL 15 and hand-built messages."""

from __future__ import annotations

import struct

import pytest

from agentledger import errors
from agentledger.relay import pgoutput

# Captured with pg_logical_slot_peek_binary_changes(..., 'proto_version', '1',
# 'publication_names', 'agentledger_outbox') after one INSERT INTO event_outbox.
BEGIN = bytes.fromhex("42000000000bd59990000304a645ee5d2b00000465")
RELATION = bytes.fromhex(
    "52000047fc7075626c6963006576656e745f6f7574626f780064000a0169640000000b86ffffffff0074"
    "656e616e745f69640000000b86ffffffff006f7065726174696f6e5f69640000000b86ffffffff00616767"
    "726567617465747970650000000019ffffffff0061676772656761746569640000000019ffffffff007479"
    "70650000000019ffffffff007061796c6f61640000000edaffffffff007472616365706172656e74000000"
    "0019ffffffff00747261636573746174650000000019ffffffff00637265617465645f617400000004a0ff"
    "ffffff"
)
INSERT = bytes.fromhex(
    "49000047fc4e000a740000002436663163326133652d306434622d346538652d396331612d32623363346435"
    "6536663730740000002431313131313131312d313131312d343131312d383131312d31313131313131313131"
    "31316e74000000056175646974740000002431313131313131312d313131312d343131312d383131312d3131"
    "31313131313131313131740000000e61756469742e7265636f72646564740000004f7b2274797065223a2022"
    "61756469742e7265636f72646564222c202274656e616e745f6964223a202231313131313131312d31313131"
    "2d343131312d383131312d313131313131313131313131227d740000003730302d3061663736353139313663"
    "6434336464383434386562323131633830333139632d623761643662373136393230333333312d30316e7400"
    "00001d323032362d31322d30322031343a33313a35342e3436323739372b3030"
)
COMMIT = bytes.fromhex("4300000000000bd59990000000000bd599c0000304a645ee5d2b")
TENANT = "11111111-1111-4111-8111-111111111111"


def test_begin_carries_commit_lsn_and_time() -> None:
    msg = pgoutput.decode(BEGIN)
    assert msg == pgoutput.Begin(final_lsn=0x0BD59990, commit_time_us=0x304A645EE5D2B, xid=0x465)
    # 2026-12-02, the capture date: the epoch conversion is right to the day.
    assert 1_795_000_000 < pgoutput.unix_seconds(msg.commit_time_us) < 1_797_000_000


def test_commit_carries_end_lsn_after_commit_lsn() -> None:
    msg = pgoutput.decode(COMMIT)
    assert isinstance(msg, pgoutput.Commit)
    assert (msg.commit_lsn, msg.end_lsn) == (0x0BD59990, 0x0BD599C0)
    assert msg.commit_time_us == pgoutput.decode(BEGIN).commit_time_us  # type: ignore[union-attr]


def test_relation_lists_columns_in_order() -> None:
    msg = pgoutput.decode(RELATION)
    assert isinstance(msg, pgoutput.Relation)
    assert (msg.namespace, msg.name, msg.replica_identity) == ("public", "event_outbox", "d")
    assert [c.name for c in msg.columns] == [
        "id", "tenant_id", "operation_id", "aggregatetype", "aggregateid", "type", "payload",
        "traceparent", "tracestate", "created_at",
    ]
    assert msg.columns[0].is_key and not msg.columns[1].is_key
    assert msg.columns[6].type_oid == 3802  # jsonb


def test_insert_gives_text_values_and_nulls() -> None:
    relation = pgoutput.decode(RELATION)
    msg = pgoutput.decode(INSERT)
    assert isinstance(msg, pgoutput.Insert) and isinstance(relation, pgoutput.Relation)
    assert msg.relation_oid == relation.oid
    row = dict(zip([c.name for c in relation.columns], msg.values, strict=True))
    assert row["id"] == "6f1c2a3e-0d4b-4e8e-9c1a-2b3c4d5e6f70"
    assert row["operation_id"] is None and row["tracestate"] is None
    assert row["aggregatetype"] == "audit" and row["aggregateid"] == TENANT
    assert row["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert row["payload"] == f'{{"type": "audit.recorded", "tenant_id": "{TENANT}"}}'


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"t" + struct.pack("!i", len(raw)) + raw


def test_hand_built_insert_with_multibyte_text() -> None:
    body = b"I" + struct.pack("!I", 42) + b"N" + struct.pack("!h", 2) + _text("café ✓") + b"n"
    assert pgoutput.decode(body) == pgoutput.Insert(42, ("café ✓", None))


@pytest.mark.parametrize(
    "payload, kind",
    [
        (b"O" + struct.pack("!Q", 1) + b"origin\x00", "O"),
        (b"Y" + struct.pack("!I", 1) + b"public\x00mood\x00", "Y"),
        (b"T" + struct.pack("!iB", 1, 0) + struct.pack("!I", 16384), "T"),
        (b"U" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 0), "U"),
        (b"D" + struct.pack("!I", 1) + b"K" + struct.pack("!h", 0), "D"),
        (b"M" + struct.pack("!BQ", 0, 1) + b"prefix\x00" + struct.pack("!i", 0), "M"),
    ],
)
def test_other_messages_are_skipped(payload: bytes, kind: str) -> None:
    assert pgoutput.decode(payload) == pgoutput.Skipped(kind)


@pytest.mark.parametrize(
    "payload, match",
    [
        (b"", "empty"),
        (b"Z", "unknown"),
        (BEGIN[:-2], "truncated"),
        (INSERT[:40], "truncated"),
        (RELATION[:12], "not terminated"),
        (b"I" + struct.pack("!I", 1) + b"K", "without a new tuple"),
        (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"b", "format"),
        (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"u", "TOAST"),
        # Cut inside the tuple: no column count, a missing value, a length past the end, a
        # negative length.
        (b"I" + struct.pack("!I", 1) + b"N", "truncated"),
        (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 2) + b"n", "truncated"),
        (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"t" + struct.pack("!i", 9)
         + b"abc", "truncated"),
        (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"t" + struct.pack("!i", -1),
         "truncated"),
        (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"t\x00\x00", "truncated"),
        (COMMIT[:-1], "truncated"),
    ],
)
def test_malformed_messages_raise_decode_error(payload: bytes, match: str) -> None:
    with pytest.raises(errors.DecodeError, match=match) as info:
        pgoutput.decode(payload)
    assert info.value.retryable is False
