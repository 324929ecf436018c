"""The streaming loop: replication slot → pgoutput → router → Kafka → sweep → confirm.

One session = one replication connection streaming from the slot's confirmed LSN. Any
failure (database or broker restart, a failed delivery) ends the session; the next one
starts again from the slot, so what was not confirmed is streamed, and published, again.
Duplicates are possible and carry the same event id; losses are not: the slot is never
confirmed past a record without a successful delivery report (see ``checkpoint``).
"""

from __future__ import annotations

import logging
import queue
import select
import threading
import time
from typing import Any, cast

from confluent_kafka.admin import AdminClient
from opentelemetry.metrics import MeterProvider

from agentledger import errors, faults
from agentledger.relay import (
    backstop,
    checkpoint,
    metrics,
    options,
    pgoutput,
    publisher,
    repository,
    routing,
    topics,
)

log = logging.getLogger(__name__)
# A streamed transaction still invisible after this long is worth a log line (a standby away).
VISIBILITY_NOTICE_S = 1.0


class _Session:
    """State of one replication connection; discarded with it."""

    def __init__(self, epoch: int, opts: options.RelayOptions) -> None:
        self.epoch = epoch
        self.checkpoint = checkpoint.Checkpoint()
        # A new session scans the outbox at its first caught-up moment (see ``backstop``).
        self.backstop = backstop.Backstop(opts.backstop_age, opts.backstop_interval,
                                          opts.sweep_batch)
        self.relations: dict[int, pgoutput.Relation] = {}
        self.txn: checkpoint.Transaction | None = None
        self.records = 0
        # When acknowledged rows are swept next at the latest (see ``_confirm``); 0: none wait.
        self.sweep_at = 0.0
        # Last time delivery moved: a report applied, or the first record put in flight.
        self.progress_at = time.monotonic()


class Relay:
    """Relays committed outbox rows to Kafka until stopped.

    Args:
        opts: connections and tunables.
        meter_provider: OpenTelemetry meter provider (the global one when ``None``).
    """

    def __init__(self, opts: options.RelayOptions, meter_provider: MeterProvider | None = None):
        self.opts = opts
        self.metrics = metrics.RelayMetrics(meter_provider, opts.slot)
        self.router = routing.Router(opts.topic_namespace)
        self._publisher = publisher.Publisher(
            opts.kafka_bootstrap,
            linger_ms=opts.linger_ms,
            delivery_timeout_ms=opts.delivery_timeout_ms,
            relay_metrics=self.metrics,
            trace_acks=opts.trace_acks,
        )
        self._topics = topics.Topics(
            AdminClient({"bootstrap.servers": opts.kafka_bootstrap}),
            opts.partitions,
            opts.replication_factor,
            opts.topic_timeout,
        )
        self._epoch = 0
        self.sessions_started = 0

    def run(self, stop: threading.Event) -> None:
        """Stream until ``stop`` is set, reconnecting with exponential backoff.

        Raises:
            RelayError: a non-retryable condition (slot missing and not to be created,
                publication missing, undecodable WAL): an operator must act.
        """
        delay = self.opts.backoff_initial
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    self._run_session(stop)
                except errors.RelayError as exc:
                    if not exc.retryable:
                        log.error("event=relay.fatal code=%s reason=%s", exc.code, exc.message)
                        raise
                    log.warning("event=relay.session_failed code=%s reason=%s cause=%r",
                                exc.code, exc.message, exc.__cause__)
                if stop.is_set():
                    break
                if time.monotonic() - started > 30:
                    delay = self.opts.backoff_initial  # it was healthy for a while
                stop.wait(delay)
                delay = min(delay * 2, self.opts.backoff_max)
        finally:
            self._publisher.close(self.opts.shutdown_timeout)

    def _run_session(self, stop: threading.Event) -> None:
        self._epoch += 1
        session = _Session(self._epoch, self.opts)
        self._publisher.reset_if_needed()
        ctrl = repository.connect(self.opts.database_url)
        repl: Any = None
        try:
            exists = repository.slot_exists(ctrl, self.opts.slot)
            if not exists and not self.opts.create_slot:
                raise repository.require_slot(self.opts.slot)
            repository.check_publication(ctrl, self.opts.publication)
            repository.prepare(ctrl)
            repl = repository.connect_replication(self.opts.database_url)
            cur = repl.cursor()
            pre_slot: list[tuple[str, dict[str, str | None]]] = []
            if not exists:
                created = repository.create_slot(cur, self.opts.slot)
                faults.point_sync("relay.after_slot_created")  # the snapshot is not read yet
                if created is not None:
                    # The exact set the slot will never stream, read while the exported
                    # snapshot lives; if this session dies before they are acknowledged, the
                    # backstop finds them in the table (nothing here is kept in memory).
                    pre_slot = repository.snapshot_rows(ctrl, created[1])
            with repository.translated("start_replication"):
                cur.start_replication(
                    slot_name=self.opts.slot,
                    decode=False,
                    options={"proto_version": "1", "publication_names": self.opts.publication},
                    status_interval=self.opts.status_interval,
                )
            if pre_slot:
                self._publish_rows(session, pre_slot, reason="pre_slot")
            self.sessions_started += 1
            log.info("event=relay.streaming slot=%s epoch=%d", self.opts.slot, session.epoch)
            self._stream(stop, session, ctrl, repl, cur)
            self._drain_on_stop(session, ctrl, cur)
        finally:
            for conn in (repl, ctrl):
                if conn is not None and not conn.closed:
                    conn.close()

    def _stream(self, stop: threading.Event, s: _Session, ctrl: Any, repl: Any, cur: Any) -> None:
        next_metrics = 0.0
        while not stop.is_set():
            acked = self._apply_reports(s)
            self._check_stall(s)
            self._confirm(s, ctrl, cur)
            if time.monotonic() >= next_metrics:
                self.metrics.retained_wal_bytes = repository.retained_wal_bytes(
                    ctrl, self.opts.slot
                )
                next_metrics = time.monotonic() + self.opts.metrics_interval
            self._finish_backstop(s, ctrl)
            # One read pass: decode up to ``read_batch`` messages, ask once whether all their
            # transactions are visible, then route and publish them in order.
            passed: list[pgoutput.Message] = []
            xids: list[int] = []
            caught_up = False
            while len(passed) < self.opts.read_batch and (
                s.checkpoint.in_flight_records + len(passed) < self.opts.max_in_flight
            ):
                with repository.translated("read_message"):
                    msg = cur.read_message()
                if msg is None:
                    caught_up = True
                    break
                decoded = pgoutput.decode(msg.payload)
                if type(decoded) is pgoutput.Begin:
                    xids.append(decoded.xid)
                passed.append(decoded)
            if xids:
                self._wait_visible(ctrl, xids)
            for decoded in passed:
                self._handle(s, decoded)
            if caught_up and s.backstop.due():
                self._scan_backstop(s, ctrl)
            if passed or acked:
                continue
            # Nothing to do: sleep until WAL arrives, a report arrives, a sweep is due, or
            # housekeeping.
            waiting = [self._publisher.wake_fd]
            if s.checkpoint.in_flight_records < self.opts.max_in_flight:
                waiting.append(repl)
            wait = self.opts.idle_wait
            if s.sweep_at:
                wait = max(0.0, min(wait, s.sweep_at - time.monotonic()))
            select.select(waiting, [], [], wait)
            self._publisher.drain_wake()

    def _publish_rows(
        self, s: _Session, rows: list[tuple[str, dict[str, str | None]]], *, reason: str
    ) -> None:
        """Publish outbox rows the slot will not stream, as one backstop batch.

        ``pre_slot``: like Debezium's initial snapshot, the rows committed before the slot
        existed. ``stale``: rows the scan found long after they should have left the outbox.
        Swept once all are acknowledged; never part of the slot's checkpoint.
        """
        batch = s.backstop.start(reason)
        for table, row in rows:
            record = self.router.route(table, row)
            self._topics.ensure(record.topic, record.family)
            s.backstop.add(batch, record.table, record.event_id)
            self._publisher.publish(record, None, (s.epoch, batch))
        self.metrics.backstop_published(len(rows), reason)
        log.log(logging.INFO if reason == "pre_slot" else logging.WARNING,
                "event=relay.backstop reason=%s rows=%d", reason, len(rows))

    def _scan_backstop(self, s: _Session, ctrl: Any) -> None:
        """One batch of the outbox scan (see ``backstop``): publish what the stream missed."""
        found = repository.stale_rows(ctrl, age_s=s.backstop.age_s, after=s.backstop.after,
                                      limit=s.backstop.limit)
        s.backstop.read(len(found), found[-1][2] if found else None)
        in_flight = s.checkpoint.event_ids()
        missed = [(table, row) for table, row, _ in found if row.get("id") not in in_flight]
        if missed:
            self._publish_rows(s, missed, reason="stale")

    def _finish_backstop(self, s: _Session, ctrl: Any) -> None:
        """Sweep a backstop batch once Kafka acknowledged all of it."""
        batch = s.backstop.batch
        if batch is None or not batch.acknowledged:
            return
        if batch.rows:
            # Fewer deletions than rows is fine here: the stream may have swept some first.
            repository.sweep(ctrl, batch.rows)
        s.backstop.done(batch)

    def _produce(
        self,
        s: _Session,
        txn: checkpoint.Transaction,
        table: str,
        row: dict[str, str | None],
    ) -> None:
        # Where the record comes from in the WAL: a consumer that cannot find its row yet
        # can ask whether this transaction is visible, instead of guessing (issue 18).
        record = self.router.route(table, row, txn.headers)
        self._topics.ensure(record.topic, record.family)
        if not s.checkpoint.in_flight_records:
            s.progress_at = time.monotonic()
        s.checkpoint.add(txn, record.table, record.event_id)
        self._publisher.publish(record, txn.commit_time_us, (s.epoch, txn))
        s.records += 1

    def _wait_visible(self, ctrl: Any, xids: list[int]) -> None:
        """Hold a read pass until other sessions can see all its transactions (fail closed).

        One prepared query over the pass's xids (``repository.invisible``), then only the
        ones still invisible are asked again. Under synchronous replication nearly every
        transaction waits a few milliseconds (the standby's round trip): routine, so only a
        wait past ``VISIBILITY_NOTICE_S`` is logged (``relay.visibility_wait``, then
        ``relay.visible`` with how long it took).
        """
        waiting = repository.invisible(ctrl, xids)
        if not waiting:
            return
        held = set(waiting)
        started = time.monotonic()
        deadline, pause, noticed = started + self.opts.visibility_timeout, 0.005, False
        while time.monotonic() < deadline:
            time.sleep(pause)  # polling a commit we cannot be notified of; bounded by deadline
            waiting = repository.invisible(ctrl, sorted(waiting))
            if not waiting:
                if noticed:
                    log.info("event=relay.visible xids=%s waited_ms=%d", _xids(held),
                             (time.monotonic() - started) * 1000)
                return
            if not noticed and time.monotonic() - started >= VISIBILITY_NOTICE_S:
                log.warning("event=relay.visibility_wait xids=%s", _xids(waiting))
                noticed = True
            pause = min(pause * 2, 0.5)
        first = min(waiting)
        raise errors.NotVisibleYet("a streamed transaction is still invisible; restarting",
                                   xid=first, invisible=len(waiting),
                                   waited_s=self.opts.visibility_timeout)

    def _handle(self, s: _Session, msg: pgoutput.Message) -> None:
        """Route one decoded message; its transaction is visible already (``_wait_visible``):
        nothing is published, nor swept, before that — an executor would not find its row,
        and the sweep would delete nothing (issue 18)."""
        if isinstance(msg, pgoutput.Begin):
            s.txn = s.checkpoint.begin(msg.final_lsn, msg.commit_time_us, msg.xid)
            s.txn.headers = (("xid", str(msg.xid).encode()),
                             ("commit_lsn", _fmt_lsn(msg.final_lsn).encode()))
        elif isinstance(msg, pgoutput.Insert):
            relation = s.relations.get(msg.relation_oid)
            if relation is None or s.txn is None:
                raise errors.DecodeError("insert before its relation or outside a transaction")
            if relation.name not in repository.OUTBOX_TABLES:
                log.warning("event=relay.foreign_table table=%s.%s", relation.namespace,
                            relation.name)
                return
            row = {c.name: v for c, v in zip(relation.columns, msg.values, strict=True)}
            self._produce(s, s.txn, relation.name, row)
        elif isinstance(msg, pgoutput.Commit):
            s.checkpoint.commit(msg.end_lsn)
            s.txn = None
        elif isinstance(msg, pgoutput.Relation):
            s.relations[msg.oid] = msg

    def _apply_reports(self, s: _Session) -> int:
        applied = 0
        while True:
            try:
                served = self._publisher.reports.get_nowait()
            except queue.Empty:
                break
            for report in served:
                epoch, owner = cast(tuple[int, checkpoint.Transaction | backstop.Batch],
                                    report.token)
                if epoch != s.epoch:
                    continue  # a record of an abandoned session: it will be streamed again
                if isinstance(owner, backstop.Batch):
                    s.backstop.delivered(owner, report.ok)
                else:
                    s.checkpoint.delivered(owner, report.ok)
                applied += 1
                if not report.ok:
                    # A new producer for the next session: the old one's queue would only
                    # resend what the session streams again from the slot.
                    self._publisher.request_reset("delivery_failed")
                    raise errors.DeliveryFailed("Kafka did not acknowledge a record",
                                                reason=report.error)
        if applied:
            s.progress_at = time.monotonic()
        return applied

    def _check_stall(self, s: _Session) -> None:
        waited = time.monotonic() - s.progress_at
        if s.checkpoint.in_flight_records and waited > self.opts.stall_timeout:
            self._publisher.request_reset("stalled")
            raise errors.DeliveryStalled(
                "no delivery report while records were in flight",
                in_flight=s.checkpoint.in_flight_records, seconds=round(waited, 1),
            )

    def _confirm(self, s: _Session, ctrl: Any, cur: Any, *, now: bool = False) -> None:
        """Sweep the rows of acknowledged transactions, then confirm their end LSN.

        Not per acknowledged transaction: once ``sweep_batch`` rows are acknowledged, or
        ``sweep_interval`` after the first acknowledgement waiting (``now``: at once). A row
        waits that much longer in the outbox; its record is on Kafka already.
        """
        cp = s.checkpoint
        if not now and cp.acked_records < self.opts.sweep_batch:
            if not (cp.acked_records or cp.committed):
                return  # nothing a sweep could take
            if not s.sweep_at:
                s.sweep_at = time.monotonic() + self.opts.sweep_interval
                return
            if time.monotonic() < s.sweep_at:
                return
        s.sweep_at = 0.0
        while True:
            txns, rows = s.checkpoint.sweepable(self.opts.sweep_batch)
            if not txns:
                return
            faults.point_sync("relay.after_produce")  # acknowledged by Kafka, LSN not yet flushed
            if rows and repository.sweep(ctrl, rows) < len(rows):
                # Fewer rows deleted than published: legitimate only if a previous session
                # swept them already (a re-streamed transaction). A row still there is never
                # confirmed past: the slot would move on and strand it (issue 18).
                still = repository.left(ctrl, rows)
                if still:
                    raise errors.RelayError("the sweep left published outbox rows in place; "
                                            "not confirming", rows=still)
            faults.point_sync("relay.after_sweep")  # rows deleted, their LSN not yet flushed
            lsn = s.checkpoint.swept(txns)
            with repository.translated("send_feedback"):
                cur.send_feedback(flush_lsn=lsn, force=True)
            if len(rows) < self.opts.sweep_batch:
                return  # what is left is not acknowledged yet (or is a full batch more)

    def _drain_on_stop(self, s: _Session, ctrl: Any, cur: Any) -> None:
        """Graceful stop: give in-flight records a chance to be confirmed, then confirm."""
        deadline = time.monotonic() + self.opts.shutdown_timeout
        while (s.checkpoint.in_flight_records or s.backstop.in_flight) and (
                time.monotonic() < deadline):
            self._publisher.flush(0.1)
            self._apply_reports(s)
        self._apply_reports(s)
        self._finish_backstop(s, ctrl)
        while True:
            before = s.checkpoint.confirmed_lsn
            self._confirm(s, ctrl, cur, now=True)
            if s.checkpoint.confirmed_lsn == before:
                break
        log.info("event=relay.stopped confirmed_lsn=%s in_flight=%d backstop_passes=%d",
                 _fmt_lsn(s.checkpoint.confirmed_lsn), s.checkpoint.in_flight_records,
                 s.backstop.passes)


def _xids(xids: set[int]) -> str:
    """Xids for a log line, comma-separated (only the ones waited for: normally a few)."""
    return ",".join(map(str, sorted(xids)))


def _fmt_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
