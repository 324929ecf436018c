"""The peer: the same workload on DBOS Transact, run as ``python -m bench.peer_dbos``.

A Kafka consumer starts one durable workflow per proposal (DBOS's own exactly-once
``kafka_consumer``; the workflow id is derived from topic, partition and offset). The
workflow records the intent once, calls the CRM note endpoint with the operation id as
``Idempotency-Key`` (retried by DBOS), and persists the receipt: three ``@DBOS.step``s, the
two SQL ones idempotent (``ON CONFLICT DO NOTHING``, a plain ``UPDATE``), so a replayed step
changes nothing. Configuration comes from ``BENCH_PEER_*`` variables set by :mod:`bench.peer`;
its system tables live in their own database, the intent table in another.

Settings that differ from DBOS's defaults, each so the peer is as fast as DBOS honestly is
(issue 20 §6; all recorded next to its figures):
- steps, not ``@db.transaction`` datasource transactions: a datasource transaction writes its
  own checkpoint row in the application database on top of the step's in the system
  database; steps running the same idempotent SQL save about a third of the checkpoint
  traffic;
- no ``pool_pre_ping`` (DBOS's default adds a ``SELECT 1`` per checkout) on either engine,
  and both pools as large as the queue's concurrency (DBOS's default system pool is 20);
- the queue is polled every 0.1 s (DBOS's default 1 s adds ~0.5 s to every command);
- Kafka records are taken ``BENCH_PEER_KAFKA_BATCH`` at a time (default 64: bursts fill
  batches). DBOS's consumer calls ``consume(batch, timeout=1.0)``, which waits for a full batch
  or the second: at the steady phase's trickle that wait is most of the peer's latency, so
  the latency phase restarts the peer with batches of 1 (:mod:`bench.peer`);
- the CRM is called with urllib3, the cheapest blocking client measured here
  (``bench/http_clients.py``: ~0.6 CPU-ms per request in worker threads; httpx sync ~1.0).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

import sqlalchemy as sa
import urllib3
from dbos import DBOS, DBOSConfig, KafkaMessage

INTENT_TABLE = """
CREATE TABLE IF NOT EXISTS peer_command (
  operation_id uuid PRIMARY KEY,
  tenant_id uuid NOT NULL,
  action text NOT NULL,
  resource_id text NOT NULL,
  arguments jsonb NOT NULL,
  state text NOT NULL,
  receipt text,
  created_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz
)
"""

env = os.environ
QUEUE = "bench_crm"
# The same bound on calls in flight as our executor's max_in_flight per instance.
CONCURRENCY = int(env.get("BENCH_PEER_CONCURRENCY", "64"))
# DBOS's queues are polled; its default of 1 s would add ~0.5 s to every command.
POLL_S = float(env.get("BENCH_PEER_POLL_S", "0.1"))
BATCH = int(env.get("BENCH_PEER_KAFKA_BATCH", "64"))
TOKENS: dict[str, str] = json.loads(env.get("BENCH_PEER_TOKENS", "{}"))
# Both pools as large as the work in flight, without a liveness query per checkout.
POOL = {"pool_size": CONCURRENCY + 8, "max_overflow": 0, "pool_pre_ping": False}

config: DBOSConfig = {
    "name": "agentledger-bench-peer",
    "system_database_url": env.get("BENCH_PEER_SYSTEM_DB", ""),
    "executor_id": env.get("BENCH_PEER_EXECUTOR_ID", "peer-1"),
    "log_level": "WARNING",
    "db_engine_kwargs": dict(POOL),
    "sys_db_pool_size": int(POOL["pool_size"]),
    "kafka_queue_polling_interval_sec": POLL_S,
}
if __name__ == "__main__":
    DBOS(config=config)
    app = sa.create_engine(env["BENCH_PEER_APP_DB"].replace("postgresql://",
                                                            "postgresql+psycopg2://", 1),
                           isolation_level="READ COMMITTED", **POOL)
    # The same client timeouts as our CRM connector; one pool shared by the worker threads.
    crm_url = env.get("BENCH_PEER_CRM_URL", "").rstrip("/")
    crm = urllib3.PoolManager(maxsize=CONCURRENCY, block=True, retries=False,
                              timeout=urllib3.Timeout(connect=2.0, read=5.0))

    @DBOS.step()
    def record_intent(proposal: dict[str, Any]) -> None:
        with app.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO peer_command (operation_id, tenant_id, action, resource_id,"
                " arguments, state) VALUES (:op, :tenant, :action, :target,"
                " CAST(:args AS jsonb), 'pending') ON CONFLICT (operation_id) DO NOTHING"),
                {"op": proposal["operation_id"], "tenant": proposal["tenant_id"],
                 "action": proposal["action"], "target": proposal["target"],
                 "args": json.dumps(proposal["arguments"])})

    @DBOS.step(retries_allowed=True, max_attempts=3, interval_seconds=0.2)
    def create_note(proposal: dict[str, Any]) -> str:
        args = proposal["arguments"]
        response = crm.request(
            "POST", f"{crm_url}/v1/customers/{args['customer_id']}/notes",
            body=json.dumps({"body": args["body"]}).encode(),
            headers={"Authorization": f"Bearer {TOKENS[proposal['tenant_id']]}",
                     "Idempotency-Key": proposal["operation_id"],
                     "Content-Type": "application/json"})
        if response.status >= 400:
            raise RuntimeError(f"the CRM answered {response.status}")
        return f"crm:note:{json.loads(response.data)['note_id']}"

    @DBOS.step()
    def persist_receipt(operation_id: str, receipt: str) -> None:
        with app.begin() as conn:
            conn.execute(sa.text(
                "UPDATE peer_command SET state = 'succeeded', receipt = :receipt,"
                " finished_at = now() WHERE operation_id = :op"),
                {"op": operation_id, "receipt": receipt})

    @DBOS.kafka_consumer({"bootstrap.servers": env["BENCH_PEER_BOOTSTRAP"],
                          "group.id": env["BENCH_PEER_GROUP"]},
                         [env["BENCH_PEER_TOPIC"]], queue_name=QUEUE, batch_size=BATCH)
    @DBOS.workflow()
    def on_proposal(msg: KafkaMessage) -> None:
        proposal = json.loads(msg.value)
        record_intent(proposal)
        receipt = create_note(proposal)
        persist_receipt(proposal["operation_id"], receipt)

    logging.basicConfig(level=logging.WARNING)
    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=CONCURRENCY, polling_interval_sec=POLL_S)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print("event=peer_ready", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=5)
    crm.clear()
    app.dispose()
