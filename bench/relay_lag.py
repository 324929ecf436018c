"""Relay lag benchmark: commit → Kafka acknowledgement, p50/p99, at a steady admission rate.

    . .local/env && .venv/bin/python -m bench.relay_lag --seconds 20 --rate 200

Creates a scratch database (migrated) on the server of AGENTLEDGER_DATABASE_URL, runs the
relay in a child process (its own interpreter, as in production), admits commands through
the product's own ``Admitter.admit`` (policy, encryption, ledger + outbox + audit events, as
the admission service does) at a steady offered rate for N seconds — each admission started
on schedule, up to ``IN_FLIGHT`` at once, so a slow one does not lower the rate — waits for
the outbox to drain, and prints JSON.
Lag is the relay's own measurement (the ``agentledger.relay.lag`` histogram's input: the
commit timestamp from the pgoutput Begin message to the delivery report), collected raw so
percentiles are exact. Everything it creates (database, slot, topics) is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
import uuid
from typing import Any

import psycopg2
from confluent_kafka.admin import AdminClient

from agentledger import db, migrations, settings
from agentledger.relay import options, stream
from agentledger.testing import ledger as testing_ledger
from bench import admission, procstats, stats


def _relay_child(opts: options.RelayOptions, stop: Any, ready: Any, measuring: Any,
                 out: Any) -> None:
    relay = stream.Relay(opts)
    samples: list[float] = []
    measured = relay.metrics.acknowledged

    def acknowledged(family: str, lag_ms: float) -> None:
        if measuring.is_set():  # after the warm-up
            samples.append(lag_ms)
        measured(family, lag_ms)

    relay.metrics.acknowledged = acknowledged  # type: ignore[method-assign]
    halt = threading.Event()

    def watch() -> None:
        stop.wait()
        halt.set()

    threading.Thread(target=watch, daemon=True).start()
    runner = threading.Thread(target=relay.run, args=(halt,))
    runner.start()
    while relay.sessions_started == 0 and runner.is_alive():
        time.sleep(0.05)
    ready.set()
    runner.join()
    out.send(samples)


def _percentile(sorted_values: list[float], q: float) -> float:
    value = stats.percentile(sorted_values, q)
    return float("nan") if value is None else value


def _admin(url: str, sql: str) -> None:
    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


WARMUP_S = 1.0


def _drained(url: str, timeout: float = 60.0) -> None:
    """Until the relay has published (and swept) every outbox row, within ``timeout``."""
    deadline = time.monotonic() + timeout
    while testing_ledger.outbox_count(url) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the outbox with a deadline


# Admissions in flight at most: enough for 1,000/s with ~30 ms per admission on a busy box.
IN_FLIGHT = 64


async def _admit_steadily(url: str, rate: float, seconds: float) -> tuple[int, float]:
    """Admissions started at ``rate`` per second for ``seconds``; (admitted, elapsed s)."""
    async with admission.admitter(url, pool_size=16) as (admitter, tenants):
        slots = asyncio.Semaphore(IN_FLIGHT)
        admitted = 0

        async def one(n: int) -> None:
            nonlocal admitted
            try:
                result = await admitter.admit(admission.proposal(tenants[n % len(tenants)]))
            finally:
                slots.release()
            if result.status == "admitted":
                admitted += 1

        tasks = []
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < seconds:
            pause = start + n / rate - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)  # pacing the offered rate, not waiting for a state
            await slots.acquire()
            tasks.append(asyncio.create_task(one(n)))
            n += 1
        await asyncio.gather(*tasks)
        return admitted, time.monotonic() - start


def run(*, seconds: float, rate: float, database_url: str | None = None,
        linger_ms: int | None = None) -> dict[str, Any]:
    """Measure relay lag; returns the figures as a dict.

    Args:
        seconds: how long to admit at the steady rate.
        rate: commands per second.
        database_url: a fresh migrated database to use; by default one is created (and
            dropped) on the server of AGENTLEDGER_DATABASE_URL.
        linger_ms: the relay producer's ``linger.ms`` (the product's default when ``None``).
    """
    common = settings.load()
    name: str | None = None
    if database_url is None:
        name = f"al_bench_relay_{uuid.uuid4().hex[:8]}"
        _admin(common.database_url, f'CREATE DATABASE "{name}"')
        url = db.with_database(common.database_url, name)
    else:
        url = database_url
    tag = uuid.uuid4().hex[:8]
    opts = options.RelayOptions(
        database_url=url, kafka_bootstrap=common.kafka_bootstrap,
        slot=f"bench_{tag}", topic_namespace=f"bench{tag}.",
    )
    if linger_ms is not None:
        opts = dataclasses.replace(opts, linger_ms=linger_ms)
    ctx = mp.get_context("spawn")
    stop, ready, measuring = ctx.Event(), ctx.Event(), ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_relay_child, args=(opts, stop, ready, measuring, send),
                        name="relay")
    rows, drain_s, cpu_before, cpu_after = 0, 0.0, None, None
    try:
        if name is not None:
            asyncio.run(migrations.migrate(url, settings.REPO_ROOT / "migrations"))
        child.start()
        if not ready.wait(60):
            raise SystemExit("relay did not start streaming within 60 s")
        # Warm-up, not measured: the relay creates each topic the first time a record goes
        # to it (once per topic in a deployment's life; ~150 ms each here), and the first
        # admissions create the tenants' data keys.
        asyncio.run(_admit_steadily(url, rate, WARMUP_S))
        _drained(url)
        measuring.set()
        cpu_before = procstats.cpu_seconds(child.pid) if child.pid else None
        rows, elapsed = asyncio.run(_admit_steadily(url, rate, seconds))
        writer_done = time.monotonic()
        _drained(url)
        drain_s = time.monotonic() - writer_done
        cpu_after = procstats.cpu_seconds(child.pid) if child.pid else None
        peak_rss = procstats.peak_rss_mb(child.pid) if child.pid else None
        stop.set()
        samples = sorted(receive.recv() if receive.poll(60) else [])
        child.join(30)
    finally:
        stop.set()
        if child.is_alive():
            child.kill()
        if child.pid is not None:
            child.join(10)
        testing_ledger.drop_slot(url, opts.slot)
        if name is not None:
            _admin(common.database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        testing_ledger.delete_namespace_topics(
            AdminClient({"bootstrap.servers": common.kafka_bootstrap}), opts.topic_namespace
        )
    return {
        "benchmark": "relay_lag",
        "rate_target_per_s": rate,
        "rate_achieved_per_s": round(rows / elapsed, 1),
        "seconds": round(elapsed, 1),
        "rows": rows,
        "acknowledged": len(samples),
        "lag_ms": {
            "p50": round(_percentile(samples, 0.50), 2),
            "p99": round(_percentile(samples, 0.99), 2),
            "max": round(samples[-1], 2) if samples else None,
            "mean": round(statistics.fmean(samples), 2) if samples else None,
        },
        # The relay child's user+system CPU from the start of the measured admissions until
        # the outbox is empty again (published and swept), per record it acknowledged.
        "relay_cpu_ms_per_record": (
            round((cpu_after - cpu_before) * 1000 / len(samples), 3)
            if cpu_before is not None and cpu_after is not None and samples else None),
        # The relay's own rate: records acknowledged over the writer's time plus the drain
        # (at 1,000/s offered the in-process writer, not the relay, bounds rows per second).
        "relay_records_per_s": round(len(samples) / (elapsed + drain_s), 1) if rows else None,
        "drain_s": round(drain_s, 2),
        "relay_linger_ms": opts.linger_ms,
        "relay_peak_rss_mb": peak_rss,
        "host_cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=200.0, help="commands per second")
    parser.add_argument("--linger-ms", type=int, default=None,
                        help="the relay producer's linger.ms (default: the product's)")
    args = parser.parse_args(argv)
    result = run(seconds=args.seconds, rate=args.rate, linger_ms=args.linger_ms)
    print(json.dumps(result))
    return 0 if result["acknowledged"] >= result["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
