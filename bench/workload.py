"""The workload every system gets: note proposals on Kafka, then completions read back.

The same three steps measure our pipeline and the peer: a warm-up, a burst (every proposal
produced at once; throughput is the steady-state completion rate of the burst), and a steady
phase at half that rate (latency from produce time to the persisted outcome, with queues
short). Completion times come from the database clock (``finished_at``), produce times from
this host's clock: the same machine, so the two compare.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg2
from confluent_kafka import Producer

from agentledger.testing import identities
from bench import boxcpu, meter, pgcounters, procstats, stats

# Completions are polled, not pushed; a quarter second is far below the spans measured.
POLL_S = 0.25
# A system that finishes nothing new for this long is stuck: report what it finished.
STALL_S = 30.0
# The steady phase offers this share of the measured burst throughput, so queues stay short
# and the latency is the pipeline's own, not time spent waiting behind the burst.
STEADY_SHARE = 0.5
# The load curve's offered rates, as shares of the burst throughput: below, at and past
# saturation, so the knee shows.
CURVE_SHARES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)


def proposal(tenant: str, customer: str, op: uuid.UUID) -> bytes:
    """One ``agent.proposals.v1`` record for a CRM note, as the planner would send it.

    Signed with the test ingress key (``agentledger.testing.identities``), as ingress would.
    """
    return json.dumps(identities.sign({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": tenant, "principal_id": "user:alice", "operation_id": str(op),
        "action": "crm.note.create",
        "arguments": {"customer_id": customer, "body": f"bench note {op}"},
        "target": customer, "expected_revision": None, "planner": {"name": "bench"},
        "created_at": datetime.now(UTC).isoformat(),
    })).encode()


@dataclass
class Target:
    """Where proposals go and where completions are read."""

    bootstrap: str
    topic: str
    tenant: str
    customer: str
    database_url: str
    # SELECT operation_id::text, epoch of completion FROM ... WHERE operation_id = ANY(%s::uuid[])
    finished_sql: str
    # Optional: SELECT operation_id::text, then one epoch per milestone, in order (names in
    # ``stage_names``, the milestone each stage ends at); the steady phase reports where its
    # latency goes, stage by stage.
    stages_sql: str | None = None
    stage_names: tuple[str, ...] = ()
    _producer: Producer | None = field(default=None, init=False, repr=False)

    def producer(self) -> Producer:
        """One producer for every phase of this target: a new one spends its first ~0.5 s
        connecting and initialising idempotence, which the first records of each phase
        would otherwise count as pipeline latency (it was most of p99). The warm-up pays it."""
        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self.bootstrap,
                                       "enable.idempotence": True, "acks": "all",
                                       "linger.ms": 2})
        return self._producer


def produce(target: Target, count: int, rate: float | None = None) -> dict[str, float]:
    """Produce ``count`` proposals (at ``rate`` per second, or at once); op id → produce time."""
    producer = target.producer()
    started: dict[str, float] = {}
    begin = time.monotonic()
    for i in range(count):
        if rate:
            pause = begin + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # pacing the offered rate, not waiting for a condition
        op = uuid.uuid4()
        started[str(op)] = time.time()
        traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01".encode()
        while True:
            try:
                producer.produce(target.topic, key=target.tenant.encode(),
                                 value=proposal(target.tenant, target.customer, op),
                                 headers=[("traceparent", traceparent)])
                break
            except BufferError:
                producer.poll(0.05)  # the local queue is full: let deliveries drain
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("proposals were not all delivered to Kafka within 60 s")
    return started


def _connect(target: Target) -> Any:
    """The bench's own connection to the target's database, marked so the meter tells its
    backend from the system's (``bench.boxcpu.pg_group``). Autocommit: a transaction would
    add a BEGIN and a ROLLBACK per poll that pg_stat_statements cannot tell from the
    system's; each poll is then one marked statement, and one commit the meter takes off."""
    conn = psycopg2.connect(target.database_url, application_name=boxcpu.BENCH_APP_PREFIX)
    conn.autocommit = True
    return conn


def finished(target: Target, ops: list[str], conn: Any | None = None) -> dict[str, float]:
    own = conn is None
    conn = conn or _connect(target)
    try:
        with conn.cursor() as cur:
            cur.execute(f"{pgcounters.BENCH_SQL_MARK} {target.finished_sql}", (ops,))
            rows = cur.fetchall()
        return {str(op): float(at) for op, at in rows}
    finally:
        if own:
            conn.close()


def wait_finished(target: Target, ops: list[str], timeout: float) -> dict[str, float]:
    """Completions of ``ops``, once all are in, the deadline passes, or progress stalls.

    One connection for the whole wait: a connection per poll would be a backend started and
    ended four times a second, Postgres CPU the meter could not attribute to the bench."""
    deadline = time.monotonic() + timeout
    done: dict[str, float] = {}
    progress_at = time.monotonic()
    conn = _connect(target)
    try:
        while time.monotonic() < deadline:
            now_done = finished(target, ops, conn)
            if len(now_done) > len(done):
                progress_at = time.monotonic()
            done = now_done
            if len(done) == len(ops) or time.monotonic() - progress_at > STALL_S:
                break
            time.sleep(POLL_S)  # polling the database for completions with a deadline
    finally:
        conn.close()
    return done


def burst(target: Target, count: int, timeout: float,
          processes: procstats.Group | None = None,
          box: Callable[[], meter.Meter] | None = None) -> dict[str, Any]:
    """All proposals at once: steady-state throughput, and with ``box`` what the burst cost
    the whole box per command (``bench.meter``; its figures under ``box``)."""
    m = box() if box is not None else None
    if m is not None:
        m.quiesce()
        m.start()
    cpu_before = processes.cpu() if processes else {}
    started = produce(target, count)
    done = wait_finished(target, list(started), timeout)
    if m is not None:
        m.stop()
    cpu_after = processes.cpu() if processes else {}
    first = min(started.values())
    result: dict[str, Any] = {
        "offered": count, "completed": len(done),
        "cmds_per_s": stats.rounded(stats.steady_rate(list(done.values()))),
        "wall_s": round(max(done.values()) - first, 1) if done else None,
    }
    if m is not None:
        result["box"] = m.report(len(done))
        per = result["box"]["cpu_ms_per_cmd"]
        # The names before the meter (CPU-s per 1,000 commands = CPU-ms per command).
        result["infra_cpu_s_per_1000"] = {"postgres": per["postgres"], "kafka": per["kafka"]}
        result["commits_per_cmd"] = result["box"]["cluster_commits_per_cmd"]
    if processes:
        result["cpu_s_per_1000"] = procstats.cpu_per_1000(cpu_before, cpu_after, len(done))
        result["cpu_s_per_1000_by_process"] = {
            n: procstats.cpu_per_1000(cpu_before, cpu_after, len(done), [n]) for n in cpu_after}
    return result


def steady(target: Target, rate: float, seconds: float, timeout: float) -> dict[str, Any]:
    """Proposals at a steady ``rate``: latency from produce time to persisted outcome."""
    started = produce(target, max(10, round(rate * seconds)), rate=rate)
    done = wait_finished(target, list(started), timeout)
    latencies = stats.latencies_ms(started, done)
    out: dict[str, Any] = {
        "rate_offered_per_s": round(rate, 1), "offered": len(started), "completed": len(done),
        "ms_p50": stats.rounded(stats.percentile(latencies, 0.50)),
        "ms_p99": stats.rounded(stats.percentile(latencies, 0.99)),
        "ms_max": stats.rounded(max(latencies) if latencies else None),
    }
    if target.stages_sql:
        out["stages_ms"] = stages(target, started)
    return out


def stages(target: Target, started: dict[str, float]) -> dict[str, dict[str, float | None]]:
    """p50/p99 of each stage: from produce (or the previous milestone) to each milestone.

    Milestones come from the database clock; a transaction's ``now()`` is its start, so a
    stage ends when the transaction that records it began (its statements and COMMIT fall in
    the next stage)."""
    conn = psycopg2.connect(target.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(target.stages_sql, (list(started),))
            rows = cur.fetchall()
    finally:
        conn.close()
    spans: dict[str, list[float]] = {name: [] for name in target.stage_names}
    for op, *marks in rows:
        previous = started.get(op)
        if previous is None or any(m is None for m in marks):
            continue
        for name, mark in zip(target.stage_names, marks, strict=True):
            spans[name].append((float(mark) - previous) * 1000.0)
            previous = float(mark)
    return {name: {"p50": stats.rounded(stats.percentile(v, 0.50)),
                   "p99": stats.rounded(stats.percentile(v, 0.99))} for name, v in spans.items()}


def load_curve(target: Target, throughput: float, seconds: float, timeout: float,
               shares: tuple[float, ...] = CURVE_SHARES) -> list[dict[str, Any]]:
    """Offered rate → completed rate and latency, one step per share of ``throughput``.

    Each step offers its rate for ``seconds`` and waits for its completions; its completed
    rate is completions over the span from its first produce to its last completion (below
    the knee, the offered rate less the drain of the last few; past it, the pipeline's
    capacity while a queue builds), its p50/p99 from produce time to persisted outcome.
    """
    points: list[dict[str, Any]] = []
    for share in shares:
        rate = max(2.0, share * throughput)
        started = produce(target, max(10, round(rate * seconds)), rate=rate)
        done = wait_finished(target, list(started), timeout)
        latencies = stats.latencies_ms(started, done)
        span = max(done.values()) - min(started.values()) if done else 0.0
        points.append({
            "share": share, "offered_per_s": round(rate, 1), "offered": len(started),
            "completed": len(done),
            "completed_per_s": stats.rounded(len(done) / span) if span > 0 else None,
            "ms_p50": stats.rounded(stats.percentile(latencies, 0.50)),
            "ms_p99": stats.rounded(stats.percentile(latencies, 0.99)),
        })
    return points


def measure(target: Target, *, burst_size: int, steady_s: float, timeout: float,
            processes: procstats.Group | None = None,
            slow: Callable[[bool], None] | None = None,
            around_burst: Callable[[], AbstractContextManager[Any]] = nullcontext,
            box: Callable[[], meter.Meter] | None = None,
            ) -> dict[str, Any]:
    """Warm-up, burst, steady; then, with ``slow(True)`` armed, a second burst.

    ``around_burst`` wraps the first burst (a profiler, for instance); ``box`` makes the
    meter that measures each burst's whole-box cost.
    """
    warm = wait_finished(target, list(produce(target, 20)), timeout)
    out: dict[str, Any] = {"warmup_completed": len(warm)}
    with around_burst():
        out["burst"] = burst(target, burst_size, timeout, processes, box)
    throughput = out["burst"]["cmds_per_s"] or 10.0
    out["steady"] = steady(target, max(5.0, STEADY_SHARE * throughput), steady_s, timeout)
    if slow is not None:
        slow(True)
        try:
            out["burst_slow_provider"] = burst(target, burst_size, timeout, processes, box)
        finally:
            slow(False)
    if processes:
        out["peak_rss_mb"] = processes.peak_rss()
    return out
