"""What the tamper-evident log costs per command (issue 43), measured on a real PostgreSQL.

Two phases on fresh copies of the migrated schema, the same load in each: ``COMMANDS``
admissions through the product's admission statement (``agentledger.testing.ledger.admit``,
the ``command.admitted`` audit event copied by the trigger), in ``WRITERS`` concurrent
connections:

- ``hash``: the schema as migrated (migration 0050: each audit row's leaf hash computed by the
  copy trigger's statement);
- ``no hash``: the same trigger with the hash replaced by a constant, i.e. the cost before 0050
  plus the 32-byte column.

For each, alternated twice: statements per command (the trigger adds none: the client sends
the same ones), WAL bytes per command (``pg_current_wal_lsn`` around the load, after a
warm-up and a ``CHECKPOINT`` so both phases pay the same full-page images; nothing else
writes to the cluster), and the load's wall time x writers / commands. Then the
notary: one catch-up over the ``hash`` phase's rows, its CPU milliseconds per event
(``time.process_time`` of this process, which runs only the notary then) and its WAL bytes per
event (audit_log rows, checkpoints, outbox records, cursor); and the database backend's CPU
for one leaf hash (every row's recomputed in one statement, CPU read from ``/proc``), against
hashing jsonb's plain text (the same object, no RFC 8785).

    .venv/bin/python -m bench.evidence [--commands 2000] [--writers 4]

Prints one JSON object; docs/evidence.md quotes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import asyncpg

from agentledger import settings
from agentledger.evidence import keys, notary
from agentledger.testing import ledger as test_ledger
from bench.databases import Databases

_NO_HASH = """
CREATE OR REPLACE FUNCTION agentledger_copy_audit_events_v3() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
BEGIN
  INSERT INTO public.audit_event (event_id, tenant_id, operation_id, type, payload, traceparent,
                                  recorded_at, leaf_hash)
  SELECT n.id, n.tenant_id, n.operation_id, n.type, n.payload, n.traceparent, n.created_at,
         '\\x0000000000000000000000000000000000000000000000000000000000000000'::bytea
  FROM new_events AS n
  WHERE n.aggregatetype = 'audit' AND n.type <> 'log.checkpoint';
  RETURN NULL;
END $$;
"""


async def _lsn(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


async def _load(url: str, commands: int, writers: int) -> dict[str, Any]:
    owner = await asyncpg.connect(url)
    sent: list[str] = []
    conns = []
    for _ in range(writers):
        c = await asyncpg.connect(url)
        await c.execute("SET ROLE agentledger_admission")
        c.add_query_logger(lambda r: sent.append(r.query))
        conns.append(c)
    tenants = [uuid.uuid4() for _ in range(writers)]

    async def write(conn: asyncpg.Connection, tenant: uuid.UUID, count: int) -> None:
        for _ in range(count):
            await test_ledger.admit(conn, test_ledger.new_command(tenant, "crm"))

    # Warm up (pages allocated, plans cached), then a checkpoint just before the measured
    # load: each phase pays the same full-page images after it, whichever runs first.
    await asyncio.gather(*(write(c, t, 50) for c, t in zip(conns, tenants, strict=True)))
    await owner.execute("CHECKPOINT")
    sent.clear()
    before = await _lsn(owner)
    started = time.perf_counter()
    await asyncio.gather(*(write(c, t, commands // writers)
                           for c, t in zip(conns, tenants, strict=True)))
    wall = time.perf_counter() - started
    after = await _lsn(owner)
    for c in conns:
        await c.close()
    await owner.close()
    n = commands // writers * writers
    return {"commands": n, "wal_bytes_per_command": round((after - before) / n),
            "ms_per_command_per_writer": round(wall * 1000 * writers / n, 3),
            "statements_per_command": round(len(sent) / n, 2)}


async def _notary(url: str) -> dict[str, Any]:
    owner = await asyncpg.connect(url)
    conn = await asyncpg.connect(url)
    await conn.execute("SET ROLE agentledger_notary")
    with TemporaryDirectory() as tmp:
        keys.generate(Path(tmp))
        worker = notary.Notary(keys.load_signer(Path(tmp)))
        before = await _lsn(owner)
        cpu = time.process_time()
        events = await notary.catch_up(conn, worker, timeout_s=600)
        cpu = time.process_time() - cpu
        after = await _lsn(owner)
    checkpoints = await owner.fetchval("SELECT count(*) FROM audit_checkpoint")
    # The database's side of the hash: every row's recomputed in one statement, three times,
    # and the backend's own CPU time read from /proc (the server is local): with the RFC 8785
    # form, and with jsonb's plain text instead (what building the object and hashing cost).
    pid = await owner.fetchval("SELECT pg_backend_pid()")
    rows = max(int(await owner.fetchval("SELECT count(*) FROM audit_event")), 1)

    def backend_cpu_s() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def cpu_us_per_row(expression: str) -> float:
        started = backend_cpu_s()
        for _ in range(3):
            await owner.fetchval(f"SELECT count({expression}) FROM audit_event")
        return round((backend_cpu_s() - started) * 1e6 / (3 * rows), 1)

    args = "event_id, tenant_id, operation_id, type, payload, traceparent, recorded_at"
    jcs_us = await cpu_us_per_row(f"agentledger_audit_leaf_hash({args})")
    plain_us = await cpu_us_per_row(
        "sha256(convert_to(jsonb_build_object('v', 1, 'event_id', event_id, 'tenant_id', "
        "tenant_id, 'operation_id', operation_id, 'type', type, 'payload', payload, "
        "'traceparent', traceparent, 'recorded_at', recorded_at)::text, 'UTF8'))")
    await conn.close()
    await owner.close()
    return {"events": events, "checkpoints": checkpoints,
            "cpu_ms_per_event": round(cpu * 1000 / max(events, 1), 4),
            "wal_bytes_per_event": round((after - before) / max(events, 1)),
            "db_leaf_hash_cpu_us_per_event": jcs_us,
            "db_plain_hash_cpu_us_per_event": plain_us}


async def _phases(plain: str, hashed: str, commands: int, writers: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    conn = await asyncpg.connect(plain)
    await conn.execute(_NO_HASH)
    await conn.close()
    # Alternated, twice each: the box's other load moves between the phases.
    for run in (1, 2):
        out[f"no_hash_{run}"] = await _load(plain, commands, writers)
        out[f"hash_{run}"] = await _load(hashed, commands, writers)
    out["notary"] = await _notary(hashed)
    out["leaf_hash_wal_bytes_per_command"] = [
        out[f"hash_{run}"]["wal_bytes_per_command"] - out[f"no_hash_{run}"]["wal_bytes_per_command"]
        for run in (1, 2)]
    return out


def main(commands: int, writers: int) -> dict[str, Any]:
    """Both phases and the notary on fresh databases, dropped at the end."""
    with Databases(settings.load().database_url, f"ev{uuid.uuid4().hex[:6]}") as dbs:
        plain, hashed = dbs.fresh("nohash"), dbs.fresh("hash")
        return asyncio.run(_phases(plain, hashed, commands, writers))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=2000)
    parser.add_argument("--writers", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(main(args.commands, args.writers), indent=2))
