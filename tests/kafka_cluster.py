"""A PRIVATE Kafka cluster for the tests that kill brokers (issue 19 §2): three brokers (ids
1-3) and a quorum of three dedicated controllers (ids 101-103), KRaft, from the same Maven
jars, on free loopback ports, started by deploy/local/kafka-cluster.sh (which says why the
controllers stand apart). Created topics default to three replicas, ``min.insync.replicas=2``.

Per node: ``kill`` (SIGKILL, returns once the process is gone), ``stop`` (SIGTERM),
``start`` (returns once a broker is unfenced or a controller caught up). Per partition: its
leader and ISR (a metadata request to any live broker); for the quorum: its leader and epoch (the
``kafka-metadata-quorum`` answer, through deploy/local/kafka/Quorum.java).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from agentledger import settings
from agentledger.testing import processes

SCRIPT = settings.REPO_ROOT / "deploy" / "local" / "kafka-cluster.sh"
BROKERS = (1, 2, 3)
CONTROLLERS = (101, 102, 103)
# Kafka's broker.session.timeout.ms: a SIGKILLed broker is fenced (and its partitions get
# new leaders) this long after its last heartbeat. Tests wait a few times this, never less.
SESSION_TIMEOUT_S = 9.0


@dataclass(frozen=True)
class PartitionState:
    leader: int | None
    isr: tuple[int, ...]
    replicas: tuple[int, ...]


@dataclass(frozen=True)
class QuorumState:
    leader: int
    epoch: int
    voters: tuple[int, ...]


@dataclass(frozen=True)
class KafkaCluster:
    """The running cluster: its nodes, and questions safe to ask while some are dead."""

    env: dict[str, str]
    bootstrap: str
    base: Path
    # One consumer per purpose for the cluster's life, closed while every broker is up: a
    # client destroyed with a request outstanding can abort the process (librdkafka #4605).
    _consumers: dict[str, Consumer] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 150) -> str:
        done = subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        assert done.returncode == 0, f"kafka-cluster.sh {' '.join(args)}:\n{done.stderr[-3000:]}"
        return done.stdout

    def log(self, node: int) -> Path:
        return self.base / "kafka" / "cluster" / f"node-{node}" / "logs" / "server.log"

    def alive(self, node: int) -> bool:
        pidfile = self.base / "kafka" / "cluster" / f"node-{node}" / "kafka.pid"
        try:
            os.kill(int(pidfile.read_text()), 0)
        except (OSError, ValueError):
            return False
        return True

    def kill(self, node: int) -> None:
        """SIGKILL one node: no controlled shutdown, no leadership handed over."""
        self.run("kill-node", str(node))
        assert not self.alive(node)

    def stop(self, node: int) -> None:
        self.run("stop-node", str(node))

    def start(self, node: int) -> None:
        self.run("start-node", str(node))

    def start_all(self) -> None:
        """Start every node that is down (after a test, whatever it killed)."""
        for node in (*CONTROLLERS, *BROKERS):
            if not self.alive(node):
                self.start(node)

    def admin(self) -> AdminClient:
        """A client for questions asked while the cluster is whole (configs, listings).

        Mid-fault questions go through consumers instead (metadata, offsets): an admin
        request cut off by a dying broker can abort the process (librdkafka #4605, an
        assertion reached from ListConsumerGroupOffsets), and a client destroyed from
        librdkafka's own thread does too (confluent-kafka-python #2131).
        """
        return AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 5000,
                            "log_level": 0})

    def _consumer(self, group: str) -> Consumer:
        # Never subscribes: it joins no group, it only asks (offsets, watermarks, metadata).
        if group not in self._consumers:
            self._consumers[group] = Consumer({
                "bootstrap.servers": self.bootstrap, "group.id": group,
                "enable.auto.commit": False, "socket.timeout.ms": 5000, "log_level": 0,
                # A watermark question goes to the leader the client has cached and is not
                # retried elsewhere: refresh each second, or it asks a dead broker for minutes.
                "topic.metadata.refresh.interval.ms": 1000})
        return self._consumers[group]

    def close(self) -> None:
        """Close the question clients (every broker up, nothing outstanding)."""
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()

    def partitions(self, topic: str) -> dict[int, PartitionState] | None:
        """Leader, ISR and replicas of each partition of ``topic`` (a metadata request to any
        live broker); None when nobody answers or the topic is unknown."""
        consumer = self._consumer("al-metadata")
        try:
            found = consumer.list_topics(topic, timeout=5).topics.get(topic)
        except KafkaException:
            return None
        if found is None or (found.error is not None and not found.partitions):
            return None
        return {i: PartitionState(p.leader if p.leader >= 0 else None, tuple(sorted(p.isrs)),
                                  tuple(sorted(p.replicas)))
                for i, p in found.partitions.items()}

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        found = self.partitions(topic)
        return None if found is None else found.get(partition)

    def leader(self, topic: str, partition: int) -> int | None:
        state = self.partition(topic, partition)
        return None if state is None else state.leader

    def high_watermark(self, topic: str, partition: int) -> int | None:
        consumer = self._consumer("al-watermarks")
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
            return int(high)
        except KafkaException:
            return None

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The consumer group's committed offset on one partition (None: none, or no answer)."""
        consumer = self._consumer(group)
        try:
            [found] = consumer.committed([TopicPartition(topic, partition)], timeout=5)
        except KafkaException:
            return None
        return found.offset if found.error is None and found.offset >= 0 else None

    def quorum(self) -> QuorumState | None:
        """The KRaft quorum as its leader reports it; None while no controller answers."""
        done = subprocess.run(["bash", str(SCRIPT), "quorum"], env=self.env, capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            return None
        q = json.loads(done.stdout)
        return QuorumState(q["leader"], q["epoch"], tuple(v["id"] for v in q["voters"]))


@contextmanager
def kafka_cluster_running() -> Iterator[KafkaCluster]:
    """Start a private cluster on free ports; kill every node and remove its data after."""
    base = Path(tempfile.mkdtemp(prefix="al-kafka-cluster-"))
    (base / "kafka").mkdir()
    (base / "kafka" / "libs").symlink_to(settings.REPO_ROOT / ".local" / "kafka" / "libs")
    broker_ports = [processes.free_port() for _ in BROKERS]
    env = {
        **os.environ,
        "AGENTLEDGER_LOCAL_DIR": str(base),
        "AGENTLEDGER_KAFKA_BROKERS": str(len(BROKERS)),
        "AGENTLEDGER_KAFKA_PORTS": ",".join(map(str, broker_ports)),
        "AGENTLEDGER_KAFKA_CONTROLLER_PORTS": ",".join(str(processes.free_port()) for _ in CONTROLLERS),
    }
    cluster = KafkaCluster(env, ",".join(f"127.0.0.1:{p}" for p in broker_ports), base)
    try:
        cluster.run("start", timeout=240)
        yield cluster
    finally:
        try:
            cluster.start_all()  # whatever a failed test left down: close with every broker up
            cluster.close()
        except (AssertionError, subprocess.TimeoutExpired):
            pass  # left to the process's exit rather than destroyed with requests outstanding
        gc.collect()  # clients still referenced by garbage go now, from this thread
        # The data is thrown away: no controlled shutdown needed, only every process gone.
        for node in (*BROKERS, *CONTROLLERS):
            subprocess.run(["bash", str(SCRIPT), "kill-node", str(node)], env=env,
                           capture_output=True, timeout=90, check=False)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def kafka_cluster() -> Iterator[KafkaCluster]:
    with kafka_cluster_running() as cluster:
        yield cluster
