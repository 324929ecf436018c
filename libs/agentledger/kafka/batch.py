"""Batched consumption: take what the broker has, handle it concurrently, answer, commit.

One step of :class:`BatchConsumer`:

1. wait for one record, then take every record already fetched, up to ``max_records``;
2. parse each record (a parse error is poison: dead-lettered alone); records whose
   ``chain`` key is equal (an operation id) are handled one after another in offset order,
   different keys concurrently, at most ``concurrency`` at a time;
3. publish every answer and dead letter of the batch without awaiting them one by one, then
   wait once for all their delivery reports;
4. commit, per partition, the offset after the last record that is done — never past a
   record that failed retryably (or one chained behind it): the partition is rewound to it
   and redelivered after a bounded pause. Everything before it is acked.

A record's effects are durable when its handler returns (the handler commits its own
transaction), so a crash anywhere in a step redelivers records whose effects may already be
there: handlers must be idempotent, as every handler here is (admission by operation id).

Why by hand, not FastStream's batch subscriber: FastStream acks a batch as a whole (a plain
``consumer.commit()`` of the current positions) and redelivers it as a whole, while one
retryable record must rewind only its own partition, from itself on, and a poison record
must be dead-lettered alone; its per-batch path also adds a middleware frame, dependency
injection and an awaited publish per answer. confluent-kafka's ``poll``/``consume``,
``produce``/``flush``, ``commit(offsets=…)`` and ``seek`` are the whole of what is needed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import confluent_kafka
import pydantic

from agentledger import errors, faults
from agentledger.contracts import dlq, topics
from agentledger.kafka import handling, logs

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Output:
    """A record to publish once the batch is handled."""

    topic: str
    value: bytes
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()


@dataclass(frozen=True)
class Handler(Generic[T]):
    """What a service plugs into the runner.

    ``parse``: the record → the item (raising is poison: the record is dead-lettered);
    ``handle``: the item → the answers to publish; raises a retryable error to redeliver;
    ``chain``: items with the same key are handled in offset order (None: no constraint).
    """

    parse: Callable[[confluent_kafka.Message], T]
    handle: Callable[[T, confluent_kafka.Message], Awaitable[Sequence[Output]]]
    chain: Callable[[T], Hashable | None] = lambda _item: None
    # The topic carries payloads (proposals, requests): dead letters keep no bytes.
    payload_topic: bool = False


@dataclass(slots=True)
class _Slot:
    msg: confluent_kafka.Message
    outputs: Sequence[Output] = ()
    # None: done; "retry": redeliver from here; "skipped": chained behind a retry.
    held: str | None = "skipped"
    # The error code of its dead letter, counted once that is published.
    dead: str | None = None


@dataclass
class Stats:
    """Counters for tests and the benchmark."""

    batches: int = 0
    records: int = 0
    dead_lettered: int = 0
    rewinds: int = 0


# A pause between redeliveries of a partition that failed retryably (the database is down):
# doubling from the first to the last, reset by a clean batch. Bounded, never a busy loop.
REDELIVERY_PAUSES_S = (0.2, 0.4, 0.8, 1.6, 3.2, 5.0)


@dataclass
class BatchConsumer(Generic[T]):
    """A consumer group member that handles its records in batches (see the module text)."""

    # Makes a subscribed consumer: called at start, and again after a fatal consumer error.
    connect: Callable[[], confluent_kafka.Consumer]
    producer: confluent_kafka.Producer
    handler: Handler[T]
    max_records: int = 500
    concurrency: int = 64
    poll_timeout_s: float = 0.5
    delivery_timeout_s: float = 30.0
    pauses_s: Sequence[float] = REDELIVERY_PAUSES_S
    stats: Stats = field(default_factory=Stats)
    _failures: int = 0
    _consumer: confluent_kafka.Consumer | None = None

    @property
    def consumer(self) -> confluent_kafka.Consumer:
        if self._consumer is None:
            self._consumer = self.connect()
        return self._consumer

    async def run(self, stop: asyncio.Event) -> None:
        """Handle batches until ``stop`` is set, then leave the group."""
        try:
            while not stop.is_set():
                await self.step()
        finally:
            await self.close()

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await asyncio.to_thread(consumer.close)

    async def step(self) -> int:
        """Handle one batch; returns how many records it held (0 when the poll timed out)."""
        # Records the client has already fetched are taken on the loop (a poll that does not
        # wait: no thread hop, the executor's largest Python overhead under load, issue 41);
        # only a wait for the broker goes to a worker thread.
        batch = self._take(0) if self._consumer is not None else []
        if not batch:
            batch = await asyncio.to_thread(self._take, self.poll_timeout_s)
        if not batch:
            return 0
        self.stats.batches += 1
        self.stats.records += len(batch)
        slots = [_Slot(msg) for msg in batch]
        await self._handle_all(slots)
        rewind = _rewind_points(slots)
        sent = [s for s in slots if s.held is None and not _behind(s.msg, rewind)]
        try:
            await self._publish([o for s in sent for o in s.outputs])
        except errors.AgentLedgerError as exc:
            # Nothing of this batch is acked: every partition in it is redelivered from its
            # first record (answers already sent are sent again; handlers are idempotent).
            log.warning("event=batch_publish_failed error=%s", exc.message[:300])
            rewind = {tp: min(s.msg.offset() or 0 for s in slots if _tp(s.msg) == tp)
                      for tp in {_tp(s.msg) for s in slots}}
        else:
            for slot in sent:
                if slot.dead is not None:  # its dead letter was delivered: counted once
                    handling.count_dead_letter(slot.msg.topic() or "", slot.dead)
        await faults.point("batch.before_offset_commit")
        await self._commit(slots, rewind)
        if rewind:
            self.stats.rewinds += 1
            for (topic, partition), offset in rewind.items():
                self.consumer.seek(confluent_kafka.TopicPartition(topic, partition, offset))
            pause = self.pauses_s[min(self._failures, len(self.pauses_s) - 1)]
            self._failures += 1
            await asyncio.sleep(pause)  # a pause between redeliveries, not a wait for a state
        else:
            self._failures = 0
        return len(batch)

    def _take(self, timeout_s: float) -> list[confluent_kafka.Message]:
        """One record (waiting up to ``timeout_s``), then whatever is already fetched.

        ``consume(n, timeout)`` alone either waits out its timeout for a full batch or, in
        newer clients, returns the first 200 ms chunk: neither gives low latency at low rates
        and full batches at high rates, which this does on every client version.
        """
        consumer = self.consumer
        first = consumer.poll(timeout_s)
        if first is None:
            return []
        more = consumer.consume(self.max_records - 1, 0) if self.max_records > 1 else []
        out = []
        for msg in (first, *more):
            error = msg.error()
            if error is None:
                out.append(msg)
            elif error.fatal():
                # E.g. a static member fenced by its own rejoin (librdkafka #3437): this
                # consumer will never consume again. A new one rejoins the group and resumes
                # from the committed offsets; nothing of this batch was acked.
                log.error("event=consumer_fatal error=%s: reconnecting", error)
                self._consumer = None
                try:
                    consumer.close()
                except (confluent_kafka.KafkaException, RuntimeError) as exc:
                    log.warning("event=consumer_close_failed error=%s", exc)
                return []
            elif error.code() != confluent_kafka.KafkaError._PARTITION_EOF:
                log.warning("event=consume_error error=%s", error)
        return out

    async def _handle_all(self, slots: list[_Slot]) -> None:
        chains: dict[Hashable, list[tuple[_Slot, T]]] = defaultdict(list)
        dead: list[tuple[_Slot, errors.AgentLedgerError]] = []
        for i, slot in enumerate(slots):
            try:
                invalid = handling.undecodable_headers(slot.msg)
                if invalid:
                    raise errors.PoisonMessage(
                        f"header value is not UTF-8: {','.join(invalid)[:200]}")
                item = self.handler.parse(slot.msg)
                key = self.handler.chain(item)
            except Exception as exc:  # every parse failure is poison
                dead.append((slot, _poison(exc)))
                continue
            chains[("chain", key) if key is not None else ("alone", i)].append((slot, item))
        limit = asyncio.Semaphore(self.concurrency)

        async def run_chain(chain: list[tuple[_Slot, T]]) -> None:
            for slot, item in chain:
                async with limit:
                    error = await self._handle_one(slot, item)
                if error is not None:
                    return  # the rest of the chain stays "skipped": redelivered after it

        for slot, error in dead:
            self._dead_letter(slot, error)
        await asyncio.gather(*(run_chain(c) for c in chains.values()))

    async def _handle_one(self, slot: _Slot, item: T) -> errors.AgentLedgerError | None:
        try:
            slot.outputs = await self.handler.handle(item, slot.msg)
            slot.held = None
            return None
        except Exception as exc:  # classified into one action below
            error = handling.classify(exc)
            if error.retryable:
                log.warning("event=redeliver code=%s error=%s", error.code, error.message[:300])
                slot.held = "retry"
                return error
            if not isinstance(exc, errors.AgentLedgerError | pydantic.ValidationError):
                log.exception("event=handler_bug")
            self._dead_letter(slot, error)
            return None

    def _dead_letter(self, slot: _Slot, error: errors.AgentLedgerError) -> None:
        msg = slot.msg
        record = dlq.DeadLetterV1.from_raw(
            topic=msg.topic() or "", partition=msg.partition() or 0, offset=msg.offset() or 0,
            key=msg.key(), value=msg.value(), error=error, failed_at=datetime.now(UTC),
            keep_value=not self.handler.payload_topic)
        slot.outputs = (Output(topics.dlq_topic(msg.topic() or ""),
                               record.model_dump_json(by_alias=True).encode(), msg.key(),
                               (("error_code", error.code.encode()),)),)
        slot.held, slot.dead = None, error.code
        self.stats.dead_lettered += 1
        log.warning("event=dead_lettered topic=%s partition=%s offset=%s code=%s",
                    msg.topic(), msg.partition(), msg.offset(), error.code)

    async def _publish(self, outputs: list[Output]) -> None:
        """Produce every output, then wait once for all delivery reports.

        Raises:
            AnswersUndelivered: a record was not delivered (retryable: the batch is redelivered).
        """
        if not outputs:
            return  # nothing to wait for (an executor's batch answers nothing): no thread hop
        failed: list[str] = []

        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        half = (len(outputs) + 1) // 2
        for i, out in enumerate(outputs):
            self._produce(out, report)
            if i + 1 == half:
                await faults.point("batch.mid_publish")
        left = await asyncio.to_thread(self.producer.flush, self.delivery_timeout_s)
        if left or failed:
            raise errors.AnswersUndelivered(
                f"{len(failed)} answers failed and {left} undelivered: {failed[:1]}")

    def _produce(self, out: Output, report: Callable[[Any, Any], None]) -> None:
        while True:
            try:
                self.producer.produce(out.topic, out.value, out.key, headers=list(out.headers),
                                      on_delivery=report)
                return
            except BufferError:
                self.producer.poll(0.05)  # the local queue is full: serve delivery reports

    async def _commit(self, slots: list[_Slot], rewind: Mapping[tuple[str, int], int]) -> None:
        ends: dict[tuple[str, int], int] = {}
        for slot in slots:
            tp = _tp(slot.msg)
            ends[tp] = max(ends.get(tp, -1), (slot.msg.offset() or 0) + 1)
        offsets = [confluent_kafka.TopicPartition(t, p, rewind.get((t, p), end))
                   for (t, p), end in ends.items()]
        try:
            await asyncio.to_thread(self.consumer.commit, offsets=offsets, asynchronous=False)
        except confluent_kafka.KafkaException as exc:
            # Lost the partitions in a rebalance, or the broker is away: the new owner (or we,
            # later) redelivers from the last commit; handlers are idempotent.
            log.warning("event=offset_commit_failed error=%s", exc)


def _tp(msg: confluent_kafka.Message) -> tuple[str, int]:
    return (msg.topic() or "", msg.partition() or 0)


def _rewind_points(slots: list[_Slot]) -> dict[tuple[str, int], int]:
    """Per partition, the first offset that must be redelivered."""
    out: dict[tuple[str, int], int] = {}
    for slot in slots:
        if slot.held is not None:
            tp, offset = _tp(slot.msg), slot.msg.offset() or 0
            out[tp] = min(out.get(tp, offset), offset)
    return out


def _behind(msg: confluent_kafka.Message, rewind: Mapping[tuple[str, int], int]) -> bool:
    point = rewind.get(_tp(msg))
    return point is not None and (msg.offset() or 0) >= point


def _poison(exc: BaseException) -> errors.AgentLedgerError:
    error = handling.classify(exc)
    return error if not error.retryable else errors.PoisonMessage(error.message)


def connector(config: Mapping[str, Any], topics_: Sequence[str]
              ) -> Callable[[], confluent_kafka.Consumer]:
    """``BatchConsumer.connect`` for a configuration and the topics to subscribe to."""
    def connect() -> confluent_kafka.Consumer:
        consumer = confluent_kafka.Consumer(dict(config))
        consumer.subscribe(list(topics_))
        return consumer
    return connect


def consumer_config(bootstrap: str, *, group_id: str, group_instance_id: str | None,
                    session_timeout_ms: int, client_id: str) -> dict[str, Any]:
    """The consumer settings every batch consumer uses: offsets are committed by the runner."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap, "group.id": group_id, "client.id": client_id,
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "enable.auto.offset.store": False, "session.timeout.ms": session_timeout_ms,
        "logger": logs.LIBRDKAFKA,
    }
    if group_instance_id:
        config["group.instance.id"] = group_instance_id
    return config


def producer_config(bootstrap: str, *, client_id: str) -> dict[str, Any]:
    """Answers are durable before offsets move: acks from every in-sync replica, idempotent."""
    return {"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all",
            "enable.idempotence": True, "linger.ms": 2, "logger": logs.LIBRDKAFKA}
