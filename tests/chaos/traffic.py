"""Traffic for the broker chaos cases (test_brokers.py): a steady load of proposals that
waits out any fault, slow CRM answers that keep work in flight, and a probe that surfaces the
broker's own answer to an acks=all write."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from types import TracebackType

from confluent_kafka import KafkaError, Producer

from agentledger.testing.pipeline import Pipeline
from agentledger.testing.polling import wait_until
from tests.chaos import harness
from tests.kafka_cluster import SESSION_TIMEOUT_S

# Operations proposed after a fault's positive marker, so the pipeline visibly carries on.
MORE = 10
# A proposal acknowledged this late was held up by the fault (a healthy ack takes ms; a
# failover holds writes for about a session timeout; an outage, until a broker returns).
BLOCKED_S = 2 * SESSION_TIMEOUT_S


class SteadyLoad:
    """Notes proposed one after another on a thread while a fault strikes, as a client does:
    one long-lived idempotent producer (acks=all) that waits for each acknowledgement,
    however long the cluster keeps it waiting (Kafka's default 300 s delivery timeout).

    ``blocked`` counts proposals acknowledged more than ``BLOCKED_S`` after they were sent:
    writes that stopped. Every operation in ``ops`` was acknowledged.
    """

    def __init__(self, p: Pipeline, ops: dict[uuid.UUID, str], pause_s: float = 0.2) -> None:
        self.p, self.ops, self.pause_s = p, ops, pause_s
        self.blocked = 0
        self.errors: list[str] = []
        self._sent: float | None = None  # when the proposal in flight was sent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-load", daemon=True)

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=harness.SETTLE_S + 60)
        assert not self._thread.is_alive(), "the load never finished its last proposal"

    def _run(self) -> None:
        # Destroyed only here, with nothing in flight: a client destroyed while a request is
        # outstanding can abort the process (librdkafka #4605).
        producer = self.p.producer()
        n = 0
        try:
            while not self._stop.is_set():
                n += 1
                op, record = self.p.proposal("crm.note.create", {"body": f"brokers {n}"},
                                             envelope_ttl_s=harness.ENVELOPE_TTL_S)
                answer: list[KafkaError | None] = []
                self._sent = sent = time.monotonic()
                producer.produce(**record, on_delivery=lambda err, _msg, answer=answer: answer.append(err))
                while not answer:
                    producer.poll(0.5)
                self._sent = None
                if answer[0] is not None:
                    self.errors.append(f"{op}: {answer[0]}")
                    return
                self.ops[op] = "note"
                if time.monotonic() - sent > BLOCKED_S:
                    self.blocked += 1
                self._stop.wait(self.pause_s)
        finally:
            producer.flush(30)

    def waiting_s(self) -> float:
        """How long the proposal in flight has waited for its acknowledgement (0: none)."""
        sent = self._sent
        return 0.0 if sent is None else time.monotonic() - sent

    def after(self) -> set[uuid.UUID]:
        """A mark: the operations proposed so far (to tell later ones apart)."""
        return set(self.ops)

    def more(self, mark: set[uuid.UUID], n: int = MORE) -> None:
        """Go on until ``n`` operations were acknowledged after ``mark``."""
        assert wait_until(lambda: len(set(self.ops) - mark) >= n, timeout=harness.SETTLE_S), (
            f"only {len(set(self.ops) - mark)} proposals acknowledged after the mark; "
            f"{self.blocked} were held up")


class CrmDelay:
    """Hold CRM requests matching ``method`` for ``delay_ms`` while the block runs."""

    def __init__(self, p: Pipeline, method: str, delay_ms: int) -> None:
        self.p, self.method, self.delay_ms = p, method, delay_ms

    def __enter__(self) -> None:
        asyncio.run(self.p.crm.arm({"match": {"method": self.method, "path_prefix": "/v1/customers/"},
                                    "action": "delay", "delay_ms": self.delay_ms, "times": 10_000}))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        asyncio.run(self.p.crm.disarm())


class ProbeWriter:
    """acks=all writes to one topic, never retried (so the broker's own answer surfaces), on
    one producer kept until the end (no client is destroyed mid-request, librdkafka #4605)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.answers: list[str] = []
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                   "enable.idempotence": False, "retries": 0,
                                   "message.timeout.ms": 10_000, "log_level": 0})

    def write(self) -> str:
        """One write: "ok", or the name of the error it got."""
        answer: list[str] = []
        self._producer.produce(self.topic, b"probe", on_delivery=lambda err, _msg: answer.append(
            "ok" if err is None else err.name()))
        self._producer.flush(15)  # the 10 s delivery timeout answers first
        self.answers.append(answer[0] if answer else "no answer")
        return self.answers[-1]

    def close(self) -> None:
        self._producer.flush(15)
