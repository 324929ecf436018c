"""The peer: the same workload on DBOS Transact, run as ``python -m bench.peer_dbos``.

A Kafka consumer starts one durable workflow per proposal (DBOS's own exactly-once
``kafka_consumer``; the workflow id is derived from topic, partition and offset). The
workflow records the intent once (a datasource transaction), calls the CRM note endpoint
with the operation id as ``Idempotency-Key`` (a step, retried by DBOS), and persists the
receipt (a second transaction). Configuration comes from ``BENCH_PEER_*`` variables set by
:mod:`bench.peer`; its system tables live in their own database, the intent table in another.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

import httpx
import sqlalchemy as sa
from dbos import DBOS, DBOSConfig, KafkaMessage, SQLAlchemyDatasource

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
# DBOS's queues are polled; its default of 1 s would add ~0.5 s to every command, so the
# peer gets a 0.1 s poll (recorded in the results next to its figures).
POLL_S = float(env.get("BENCH_PEER_POLL_S", "0.1"))
# DBOS's consumer waits up to 1 s to fill a batch (default 250): at a steady trickle that wait
# is most of the latency. One message per batch is DBOS's latency-oriented setting.
BATCH = int(env.get("BENCH_PEER_KAFKA_BATCH", "1"))
TOKENS: dict[str, str] = json.loads(env.get("BENCH_PEER_TOKENS", "{}"))

config: DBOSConfig = {
    "name": "agentledger-bench-peer",
    "system_database_url": env.get("BENCH_PEER_SYSTEM_DB", ""),
    "executor_id": env.get("BENCH_PEER_EXECUTOR_ID", "peer-1"),
    "log_level": "WARNING",
}
if __name__ == "__main__":
    DBOS(config=config)
    db = SQLAlchemyDatasource.create(env["BENCH_PEER_APP_DB"])
    # The same client timeouts as our CRM connector; one client shared by the worker threads.
    crm = httpx.Client(base_url=env.get("BENCH_PEER_CRM_URL", ""),
                       timeout=httpx.Timeout(connect=2.0, read=5.0, write=5.0, pool=2.0),
                       limits=httpx.Limits(max_connections=CONCURRENCY))

    @db.transaction(isolation_level="READ COMMITTED")
    def record_intent(proposal: dict[str, Any]) -> None:
        db.sql_session().execute(sa.text(
            "INSERT INTO peer_command (operation_id, tenant_id, action, resource_id, arguments,"
            " state) VALUES (:op, :tenant, :action, :target, CAST(:args AS jsonb), 'pending')"
            " ON CONFLICT (operation_id) DO NOTHING"),
            {"op": proposal["operation_id"], "tenant": proposal["tenant_id"],
             "action": proposal["action"], "target": proposal["target"],
             "args": json.dumps(proposal["arguments"])})

    @DBOS.step(retries_allowed=True, max_attempts=3, interval_seconds=0.2)
    def create_note(proposal: dict[str, Any]) -> str:
        args = proposal["arguments"]
        response = crm.post(
            f"/v1/customers/{args['customer_id']}/notes", json={"body": args["body"]},
            headers={"Authorization": f"Bearer {TOKENS[proposal['tenant_id']]}",
                     "Idempotency-Key": proposal["operation_id"]})
        response.raise_for_status()
        return f"crm:note:{response.json()['note_id']}"

    @db.transaction(isolation_level="READ COMMITTED")
    def persist_receipt(operation_id: str, receipt: str) -> None:
        db.sql_session().execute(sa.text(
            "UPDATE peer_command SET state = 'succeeded', receipt = :receipt, finished_at = now()"
            " WHERE operation_id = :op"), {"op": operation_id, "receipt": receipt})

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
    crm.close()
