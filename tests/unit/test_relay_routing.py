"""Outbox rows route like Debezium's Outbox Event Router."""

from __future__ import annotations

from agentledger.relay import routing

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _row(**overrides: str | None) -> dict[str, str | None]:
    row: dict[str, str | None] = {
        "id": "6f1c2a3e-0d4b-4e8e-9c1a-2b3c4d5e6f70",
        "aggregatetype": "crm",
        "aggregateid": "t1:o1",
        "type": "command.admitted",
        "payload": '{"type": "command.admitted"}',
        "traceparent": TP,
        "tracestate": None,
    }
    row.update(overrides)
    return row


def test_command_routes_to_its_connector_topic_keyed_by_operation() -> None:
    record = routing.Router("ns.").route("command_outbox", _row())
    assert (record.topic, record.family, record.key) == ("ns.exec.crm.v1", "exec", b"t1:o1")
    assert record.value == b'{"type": "command.admitted"}'
    assert record.headers == (
        ("id", b"6f1c2a3e-0d4b-4e8e-9c1a-2b3c4d5e6f70"),
        ("type", b"command.admitted"),
        ("traceparent", TP.encode()),
    )


def test_events_route_by_aggregate_type() -> None:
    router = routing.Router()
    audit = router.route("event_outbox", _row(aggregatetype="audit", tracestate="k=v"))
    outcome = router.route("event_outbox", _row(aggregatetype="outcome", traceparent=None))
    assert (audit.topic, audit.family) == ("audit.events.v1", "audit")
    assert ("tracestate", b"k=v") in audit.headers
    assert (outcome.topic, outcome.family) == ("agent.outcomes.v1", "outcome")
    assert [name for name, _ in outcome.headers] == ["id", "type"]


def test_unroutable_rows_go_to_the_dead_letter_topic_with_a_reason() -> None:
    router = routing.Router()
    for table, row in [
        ("command_outbox", _row(aggregatetype="../etc")),
        ("event_outbox", _row(aggregatetype="crm")),
        ("command_outbox", _row(payload=None)),
    ]:
        record = router.route(table, row)
        assert (record.topic, record.family) == ("relay.dlq.v1", "dlq")
        assert dict(record.headers)["reason"]
        assert dict(record.headers)["source_table"] == table.encode()
