"""The commit-visibility race (issue 18): logical decoding streams a transaction once its
commit is flushed, before other sessions can see it when the commit waits for a synchronous
standby. Reproduced deterministically: a standby that does not exist parks the commit —
flushed, decodable, invisible — until its wait is cancelled."""

from __future__ import annotations

import threading
import uuid

import psycopg2
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from agentledger.testing import ledger
from agentledger.testing.polling import wait_until
from tests import syncrep
from tests.integration.relay import support


def _published(bootstrap: str, topic: str) -> int:
    """Records on ``topic`` (0 if it does not exist yet)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"vis-{uuid.uuid4().hex}"})
    try:
        meta = c.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in meta.partitions)
    finally:
        c.close()


def test_a_commit_parked_for_a_synchronous_standby_is_published_and_swept_only_once_visible(
    relay: support.Relay, kafka_admin: AdminClient
) -> None:
    relay.start()
    assert wait_until(lambda: "event=relay.streaming" in relay.log_text(), timeout=60), relay.log_text()[-2000:]
    tenant = uuid.uuid4()
    topic = f"{relay.namespace}exec.crm.v1"
    parked = ledger.Ledger(relay.database_url)
    try:
        with syncrep.ghost_standby(relay.database_url):
            parked.begin()
            parked.execute("SET LOCAL synchronous_commit = on")
            command = parked.admit(ledger.new_command(tenant, "crm"))
            xid = parked.fetchval("SELECT pg_current_xact_id()::text::bigint & 4294967295")
            pid = parked.pid
            committing = threading.Thread(target=parked.commit, daemon=True)  # parks in SyncRep
            committing.start()
            # Positive markers: the commit waits for the standby, and the relay has the
            # transaction in hand and holds it.
            owner = psycopg2.connect(relay.database_url)
            owner.autocommit = True
            try:
                with owner.cursor() as cur:
                    def waiting() -> bool:
                        cur.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,))
                        return (cur.fetchone() or (None,))[0] == "SyncRep"
                    assert wait_until(waiting, timeout=30)
                    # Whichever comes first: the relay holding it, or (the race) publishing it.
                    assert wait_until(lambda: "event=relay.visibility_wait" in relay.log_text()
                                      or _published(relay.bootstrap, topic) > 0, timeout=60), \
                        relay.log_text()[-3000:]
                    assert _published(relay.bootstrap, topic) == 0, "published while invisible to other sessions"
                    assert ledger.outbox_count(relay.database_url) == 0  # (other sessions see no row)
                    # The wait is cancelled: the commit completes locally and becomes visible.
                    cur.execute("SELECT pg_cancel_backend(%s)", (pid,))
            finally:
                owner.close()
            committing.join(30)
            assert not committing.is_alive()
    finally:
        parked.close()
    support.wait_for_topics(kafka_admin, [topic])  # the relay creates it with its first record
    received = support.read_topics(relay.bootstrap, [topic], lambda got: len(got) >= 1, timeout=60)
    assert [r.key for r in received] == [command.key], relay.log_text()[-3000:]
    assert received[0].header("xid") == str(xid)  # where it came from, for consumers
    assert received[0].header("commit_lsn")
    # Published once visible, then swept: the row does not outlive its publication.
    assert wait_until(lambda: ledger.outbox_count(relay.database_url) == 0, timeout=30), \
        relay.log_text()[-3000:]
    assert "event=relay.visible" in relay.log_text()
