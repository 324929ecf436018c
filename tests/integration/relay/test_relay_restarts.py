"""Restarting PostgreSQL or the broker under a running relay loses nothing.

Runs against a PRIVATE second stack (own Postgres cluster and Kafka broker on free ports,
started by deploy/local/*.sh) so restarting it never disturbs other tests.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import psycopg2
from confluent_kafka.admin import AdminClient

from tests.helpers import wait_until
from tests.integration.relay import support
from tests.private_stack import PrivateStack


class ResilientAdmitter(threading.Thread):
    """Admits commands for a few tenants, reconnecting while the database is away."""

    def __init__(self, url: str) -> None:
        super().__init__(name="admitter", daemon=True)
        self.url = url
        self.tenants = [uuid.uuid4() for _ in range(4)]
        self.stop = threading.Event()
        self.commits = 0

    def run(self) -> None:
        conn = None
        seq = 0
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = psycopg2.connect(self.url, connect_timeout=2)
                tenant = self.tenants[seq % len(self.tenants)]
                with conn, conn.cursor() as cur:
                    support.admit(cur, support.new_command(tenant, support.CONNECTORS[seq % 3]))
                    support.add_event(cur, tenant, "outcome", seq)
                self.commits += 1
                seq += 1
                self.stop.wait(0.005)  # ~150 commands/s
            except psycopg2.Error:
                if conn is not None:
                    conn.close()
                conn = None
                self.stop.wait(0.2)  # the database is restarting: back off, then retry
        if conn is not None:
            conn.close()

    def admitted_keys(self) -> set[str]:
        """Ground truth: every command whose transaction committed, outcome known or not."""
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT tenant_id::text || ':' || operation_id::text FROM agent_command"
                            " WHERE tenant_id = ANY(%s::uuid[])", ([str(t) for t in self.tenants],))
                return {row[0] for row in cur.fetchall()}
        finally:
            conn.close()


def _restart_under_load(stack: PrivateStack, service: str, log_dir: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    relay = support.Relay(stack.database_url, stack.bootstrap, f"relay_restart_{tag}",
                          f"rr{tag}.", log_dir)
    admitter = ResilientAdmitter(stack.database_url)
    try:
        proc = relay.start()
        assert wait_until(lambda: "event=relay.streaming" in relay.log_text(), timeout=30)
        admitter.start()
        assert wait_until(lambda: admitter.commits >= 200, timeout=30)
        stack.run(service, "stop")
        stack.run(service, "start")
        floor = admitter.commits
        assert wait_until(lambda: admitter.commits >= floor + 200, timeout=60)
        admitter.stop.set()
        admitter.join(timeout=30)

        expected = admitter.admitted_keys()
        assert wait_until(lambda: support.outbox_count(stack.database_url) == 0, timeout=90), (
            relay.log_text()[-3000:]
        )
        topics = [f"{relay.namespace}exec.{c}.v1" for c in support.CONNECTORS]
        records = support.read_topics(
            stack.bootstrap, topics, lambda got: expected <= {r.key for r in got}, timeout=60
        )
        missing = expected - {r.key for r in records}
        assert not missing, f"{len(missing)} of {len(expected)} commands never published"
        # The restart was felt: the session broke (Postgres) or the producer saw errors.
        felt = "event=relay.session_failed" if service == "postgres" else "event=relay.kafka_error"
        assert felt in relay.log_text()
        assert relay.terminate(proc) == 0
    finally:
        admitter.stop.set()
        relay.kill_all()
        support.drop_slot(stack.database_url, relay.slot)
        # Created only now: an admin client alive during the restart would log refusals.
        admin = AdminClient({"bootstrap.servers": stack.bootstrap})
        support.delete_namespace_topics(admin, relay.namespace)


def test_postgres_restart_while_relaying_loses_nothing(
    private_stack: PrivateStack, tmp_path: Path
) -> None:
    _restart_under_load(private_stack, "postgres", tmp_path)


def test_broker_restart_while_relaying_loses_nothing(
    private_stack: PrivateStack, tmp_path: Path
) -> None:
    _restart_under_load(private_stack, "kafka", tmp_path)
