"""Outbox rows to Kafka records, with the semantics of Debezium's Outbox Event Router.

Topic from ``aggregatetype``, key = ``aggregateid``, value = ``payload`` as JSON, headers
``id`` and ``type`` always and ``traceparent``/``tracestate`` when the row carries them.
``deploy/debezium/outbox-connector.json`` configures Kafka Connect to produce the same.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# A connector name becomes part of a topic name: Kafka allows [a-zA-Z0-9._-]; we keep it to
# lower-case names without dots so `exec.<connector>.v1` parses back unambiguously.
_CONNECTOR = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")

COMMAND_TABLE = "command_outbox"
EVENT_TABLE = "event_outbox"
EVENT_TOPICS = {"audit": "audit.events.v1", "outcome": "agent.outcomes.v1"}
# Rows that cannot be routed still must not block the stream or vanish: they go here.
DEAD_LETTER_TOPIC = "relay.dlq.v1"


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record to publish for one outbox row.

    Attributes:
        table: the outbox table the row came from (the sweep deletes it there).
        event_id: the row's ``id``: the dedupe key consumers use.
        family: bounded metric label: ``exec``, ``audit``, ``outcome`` or ``dlq``.
        topic: destination topic, namespace included.
        key: Kafka key (``aggregateid``).
        value: the JSON payload, byte for byte as the database rendered it.
        headers: ``id``, ``type``, and trace context when present.
        operation_id: the row's operation id, for the publish span only (never a header).
    """

    table: str
    event_id: str
    family: str
    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    operation_id: str | None = None


@dataclass(frozen=True)
class Router:
    """Maps an outbox row to its record.

    Attributes:
        namespace: prefix for every topic name (``""`` in production; tests and shared
            clusters use one per environment).
    """

    namespace: str = ""

    def route(self, table: str, row: Mapping[str, str | None],
              extra: tuple[tuple[str, bytes], ...] = ()) -> Record:
        """The record for one inserted outbox row; ``extra`` headers go last.

        A row that cannot go to its topic (unknown aggregate type, unsafe connector name,
        missing column) is routed to the dead-letter topic with a ``reason`` header, so it
        is published, confirmed and swept like any other, and an operator can see it.
        """
        event_id = row.get("id") or ""
        aggregatetype = row.get("aggregatetype") or ""
        family, topic, reason = self._destination(table, aggregatetype)
        headers: list[tuple[str, bytes]] = [
            ("id", event_id.encode()),
            ("type", (row.get("type") or "").encode()),
        ]
        for name in ("traceparent", "tracestate"):
            value = row.get(name)
            if value:
                headers.append((name, value.encode()))
        if not event_id or row.get("payload") is None or row.get("aggregateid") is None:
            family, topic, reason = "dlq", DEAD_LETTER_TOPIC, "missing outbox column"
        if reason:
            headers.append(("reason", reason.encode()))
            headers.append(("source_table", table.encode()))
        return Record(
            table=table,
            event_id=event_id,
            family=family,
            topic=self.namespace + topic,
            key=(row.get("aggregateid") or "").encode(),
            value=(row.get("payload") or "null").encode(),
            headers=(*headers, *extra),
            operation_id=row.get("operation_id"),
        )

    def _destination(self, table: str, aggregatetype: str) -> tuple[str, str, str]:
        if table == COMMAND_TABLE:
            if _CONNECTOR.fullmatch(aggregatetype):
                return "exec", f"exec.{aggregatetype}.v1", ""
            return "dlq", DEAD_LETTER_TOPIC, "connector name not usable in a topic"
        if table == EVENT_TABLE and aggregatetype in EVENT_TOPICS:
            return aggregatetype, EVENT_TOPICS[aggregatetype], ""
        return "dlq", DEAD_LETTER_TOPIC, "no route for this table and aggregate type"
