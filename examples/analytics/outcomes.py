"""Outcome counts per action and connector over a time window, from ``audit.events.v1`` alone.

Reads the topic from the beginning to its current end (no consumer group is committed, so
it can be run any number of times), learns each operation's action and connector from its
``command.admitted`` event, and counts the last outcome each operation reached inside the
window (an ``unknown`` later reconciled to ``succeeded`` counts once, as ``succeeded``).

    python examples/analytics/outcomes.py --bootstrap 127.0.0.1:19092 --since 24h
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

# Audit event types that record where a command ended up (see docs: audit.events.v1).
OUTCOMES = {"succeeded", "denied", "expired", "unknown", "review_required", "failed"}
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Event:
    type: str
    at_ms: int
    payload: dict[str, object]


def read_all(bootstrap: str, topic: str, timeout_s: float = 30.0) -> Iterator[Event]:
    """Every record of ``topic`` from the beginning to the end it had when we started."""
    consumer = Consumer({"bootstrap.servers": bootstrap,
                         "group.id": f"analytics-{uuid.uuid4().hex}",  # never committed
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        if meta.error is not None:
            raise SystemExit(f"topic {topic}: {meta.error}")
        ends = {}
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            offset, partition = msg.offset() or 0, msg.partition()
            if offset + 1 >= ends.get(partition or 0, 0):
                ends.pop(partition or 0, None)
            # At runtime headers are (str, bytes | None) pairs; the stubs type them loosely.
            pairs: list[tuple[str, bytes | None]] = list(msg.headers() or [])  # type: ignore[arg-type]
            headers = {k: v.decode() for k, v in pairs if v is not None}
            try:
                payload = json.loads(msg.value() or b"null")
            except ValueError:
                continue  # not ours to judge: an analyst's script skips what it cannot read
            if isinstance(payload, dict):
                yield Event(headers.get("type", ""), msg.timestamp()[1], payload)
        if ends:
            raise SystemExit(f"could not read {topic} to its end within {timeout_s}s")
    finally:
        consumer.close()


def count(events: Iterator[Event], since_ms: int, until_ms: int) -> Counter[tuple[str, str, str]]:
    """(action, connector, outcome) → operations whose last outcome in the window it was."""
    what: dict[str, tuple[str, str]] = {}
    last: dict[str, str] = {}
    for e in events:
        op = str(e.payload.get("operation_id", ""))
        kind, _, state = e.type.partition(".")
        if kind != "command":
            continue
        if state == "admitted":
            what[op] = (str(e.payload.get("action")), str(e.payload.get("connector")))
        elif state == "reconciled" and since_ms <= e.at_ms <= until_ms:
            last[op] = str(e.payload.get("outcome"))  # an operator's resolution of `unknown`
        elif state in OUTCOMES and since_ms <= e.at_ms <= until_ms:
            last[op] = state
    return Counter((*what.get(op, ("?", "?")), outcome) for op, outcome in last.items())


def duration_s(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:19092")
    parser.add_argument("--topic", default="audit.events.v1")
    parser.add_argument("--since", default="24h", help="window start, ago: 90s, 15m, 24h, 7d")
    parser.add_argument("--until", default="0s", help="window end, ago (default: now)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    now_ms = int(time.time() * 1000)
    counts = count(read_all(args.bootstrap, args.topic),
                   now_ms - duration_s(args.since) * 1000, now_ms - duration_s(args.until) * 1000)
    rows = sorted(counts.items())
    if args.json:
        for (action, connector, outcome), n in rows:
            print(json.dumps({"action": action, "connector": connector, "outcome": outcome,
                              "count": n}))
        return 0
    print(f"{'action':<24} {'connector':<10} {'outcome':<16} {'count':>6}")
    for (action, connector, outcome), n in rows:
        print(f"{action:<24} {connector:<10} {outcome:<16} {n:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
