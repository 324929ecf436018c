"""The soak's own production-shaped stack, private to it (own directories, free ports): a
3-broker KRaft cluster (tests/kafka_cluster.py), a PostgreSQL primary with a synchronous
standby holding the ledger (tests/standby.py), a third PostgreSQL for the CRM — a provider,
not our database, so restarting the ledger's primary never takes the provider down with it —
and the whole pipeline as real processes (agentledger/testing/pipeline.py) on top.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentledger.testing import processes
from agentledger.testing.pipeline import Pipeline, pipeline
from tests import netns, partition_env
from tests.chaos import harness
from tests.kafka_cluster import KafkaCluster, kafka_cluster_running
from tests.standby import SCRIPTS, StandbyPair, standby_pair_running

SERVICES = ("relay", "admission", "executor-crm", "executor-billing", "reconciler")
REPLICAS = 3


def service_env() -> dict[str, dict[str, str]]:
    """The chaos settings (short leases, a quick reconciler, a high retry cap) with
    production's consumer groups: dynamic membership, as the manifests deploy. Static
    membership (group.instance.id) is left out: a static member whose coordinator is away
    longer than its session timeout is fenced by its own rejoin, fatal in librdkafka (#3437),
    and the soak restarts brokers. The short session timeout stays: a SIGKILLed dynamic
    member holds its partitions until it expires."""
    env = {name: {**{k: v for k, v in harness.CHAOS_ENV.get(name, {}).items()
                     if not k.endswith("_GROUP_INSTANCE_ID")},
                  "AGENTLEDGER_KAFKA_REPLICATION_FACTOR": str(REPLICAS)} for name in SERVICES}
    # Where each record was acknowledged (event id, partition, offset): a record the checker
    # finds missing from its topic is then looked up at that exact offset.
    env["relay"]["AGENTLEDGER_RELAY_TRACE_ACKS"] = "true"
    return env


@dataclass(frozen=True)
class SoakStack:
    cluster: KafkaCluster
    pair: StandbyPair
    p: Pipeline
    crm_database_url: str
    logs: Path
    # The provider's own network namespace (root only): its link is what `link:provider-cut`
    # cuts; None where namespaces cannot be made (the link faults are then left out).
    crm_ns: netns.Namespace | None = None


@contextmanager
def _crm_postgres() -> Iterator[str]:
    base = Path(tempfile.mkdtemp(prefix="al-soak-crm-"))
    base.chmod(0o755)  # initdb and postgres run as the `postgres` user when we are root
    port = processes.free_port()
    env = {**os.environ, "AGENTLEDGER_LOCAL_DIR": str(base), "AGENTLEDGER_PG_PORT": str(port)}
    try:
        subprocess.run(["bash", str(SCRIPTS / "postgres.sh"), "start"], env=env, check=True,
                       capture_output=True, timeout=180)
        yield f"postgresql://agentledger:agentledger@127.0.0.1:{port}/agentledger"
    finally:
        subprocess.run(["bash", str(SCRIPTS / "postgres.sh"), "stop", "immediate"], env=env,
                       check=False, capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def soak_stack(logs: Path) -> Iterator[SoakStack]:
    """Start everything; stop and remove everything after, whatever a fault left down."""
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        cluster, pair, crm_url = _started_together(
            stack, kafka_cluster_running(), standby_pair_running(), _crm_postgres())
        # Registered after the stack's, so it runs first: every node back before the
        # pipeline stops (its services and clients close against a whole stack).
        stack.callback(_restore, cluster, pair)
        crm_ns, crm_options, crm_reached = None, {}, crm_url
        if os.geteuid() == 0:
            # The CRM in a namespace of its own, its database over a second link that no
            # fault cuts: a cut of the main link partitions the provider from every service.
            hub = stack.enter_context(partition_env.hub(crm_url))
            crm_ns = stack.enter_context(netns.Namespace(f"soak{uuid.uuid4().hex[:4]}",
                                                         extra=("db",)))
            crm_ns.route(hub.pg, "db")
            crm_options = {"prefix": crm_ns.argv([]), "url_host": crm_ns.ns_ip,
                           "host": crm_ns.ns_ip}
            crm_reached = partition_env.via(crm_url, hub.pg)
        p = stack.enter_context(pipeline(cluster.bootstrap, pair.primary_url, crm_reached, logs,
                                         env=service_env(), crm_options=crm_options))
        for name in ("admission", "executor-crm", "executor-billing"):
            p.ready[name] = _group_ready(p, name)
        # Readiness probes hold admin clients: destroyed while the brokers answer (see
        # tests/chaos/test_brokers.py), not at the interpreter's exit.
        stack.callback(gc.collect)
        stack.callback(p.ready.clear)
        yield SoakStack(cluster, pair, p, crm_url, logs, crm_ns)


def _started_together(stack: ExitStack, *managers: AbstractContextManager[Any]) -> list[Any]:
    """Enter independent context managers at once (each start is mostly waiting on JVMs and
    initdb, so the stack is up in the time of the slowest, not the sum); every one entered is
    exited by ``stack``, also when another failed to start."""
    with ThreadPoolExecutor(len(managers)) as pool:
        futures = [pool.submit(m.__enter__) for m in managers]
        wait(futures)
    for manager, future in zip(managers, futures, strict=True):
        if future.exception() is None:
            stack.push(manager.__exit__)
    return [f.result() for f in futures]  # raises the first failure, after registering exits


def _group_ready(p: Pipeline, name: str) -> Callable[[], bool]:
    """A restarted consumer's readiness (its group stable with a member), asked through a
    client made for the question. The pipeline's probe keeps one admin client for its life;
    in a soak run (seed 202) a restarted executor missed the 90 s readiness deadline after a
    broker restart while its log showed it consuming and dispatching — the long-lived client
    is the suspect, a fresh one per question rules it out."""
    group = next(v for k, v in p.services[name].env.items() if k.endswith("_GROUP_ID"))
    return lambda: processes.group_has_members(p.bootstrap, group)()


def _restore(cluster: KafkaCluster, pair: StandbyPair) -> None:
    """Whatever an interrupted fault left down comes back before teardown."""
    for pid in _stopped(pair):
        os.kill(pid, signal.SIGCONT)
    for script, verb in (("postgres.sh", ("start",)), ("standby.sh", ("start",))):
        subprocess.run(["bash", str(SCRIPTS / script), *verb], env=pair.env, check=False,
                       capture_output=True, timeout=180)
    try:
        cluster.start_all()
    except (AssertionError, subprocess.TimeoutExpired):
        pass  # torn down anyway; the cluster's own exit kills every node


def _stopped(pair: StandbyPair) -> list[int]:
    try:
        return [pid for pid in pair.standby_pids() if harness.stopped(pid)]
    except (OSError, ValueError):
        return []
