"""The soak's faults: a registry of small classes, one fault at a time.

A fault has a ``kind``; ``inject()`` strikes and returns the positive marker that it struck
(or raises ``NotStruck``); ``heal()`` undoes it and returns the marker that the system is
whole again. The scheduler (tests/soak/runner.py) always runs ``heal()`` after ``inject()``,
whatever happened in between, interruption included. Adding a fault is adding one class to
``REGISTRY``.

A fault that needs something the machine may lack says so in ``available`` (the provider's
link cut needs network namespaces, so root); the scheduler leaves it out there.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from abc import ABC, abstractmethod
from contextlib import ExitStack
from dataclasses import dataclass
from typing import ClassVar

import psycopg2

from agentledger.testing import processes
from agentledger.testing.pipeline import Pipeline
from agentledger.testing.polling import wait_until
from tests import netns
from tests.chaos import harness
from tests.kafka_cluster import BROKERS, SESSION_TIMEOUT_S, KafkaCluster
from tests.standby import StandbyPair

# A fault's effect shows within a few session timeouts (fencing, election, a client's
# metadata refresh); on a loaded 2-core box we allow generously more, as a deadline only.
FAILOVER_S = 8 * SESSION_TIMEOUT_S
# How long the standby's absence must be felt: a commit parked on it (the load proposes
# several per second, so one parks within a second or two).
PARKED_S = 60.0
# How long a provider fault may wait for a matching write (refunds wait for their approval).
ANSWER_LOST_S = 90.0


class NotStruck(AssertionError):
    """The fault was injected but its positive marker never showed."""


@dataclass
class Target:
    """What the faults act on."""

    p: Pipeline
    cluster: KafkaCluster
    pair: StandbyPair
    crm_ns: netns.Namespace | None = None


class Fault(ABC):
    kind: ClassVar[str]
    # How long the fault is left in place once struck (seconds, drawn uniformly): long
    # enough for the load to meet it, short enough for several faults per minute.
    hold_s: ClassVar[tuple[float, float]] = (0.0, 3.0)

    def __init__(self, target: Target, rng: random.Random) -> None:
        self.target, self.rng = target, rng

    @classmethod
    def available(cls, target: Target) -> bool:
        """Whether this machine and stack can inject it."""
        return True

    @abstractmethod
    def inject(self) -> str:
        """Strike; return the marker that it struck."""

    @abstractmethod
    def heal(self) -> str:
        """Undo (idempotent, safe after a failed inject); return the marker that it healed."""


class ServiceKill(Fault):
    """SIGKILL one service, restart it (as its supervisor would)."""

    service: ClassVar[str]

    def inject(self) -> str:
        svc = self.target.p.services[self.service]
        if not svc.alive():
            raise NotStruck(f"{self.service} was not running")
        assert svc.proc is not None
        pid = svc.proc.pid
        svc.kill()
        rc = svc.proc.returncode
        if rc != -signal.SIGKILL:
            raise NotStruck(f"{self.service} pid {pid} exited {rc}, not by SIGKILL")
        return f"pid {pid} exited by SIGKILL"

    def heal(self) -> str:
        svc = self.target.p.services[self.service]
        if not svc.alive():
            harness.restart(self.target.p, self.service, None)
        assert svc.proc is not None and svc.alive(), svc.tail()
        return f"restarted as pid {svc.proc.pid}, ready"


class KillRelay(ServiceKill):
    kind, service = "kill:relay", "relay"


class KillAdmission(ServiceKill):
    kind, service = "kill:admission", "admission"


class KillExecutorCrm(ServiceKill):
    kind, service = "kill:executor-crm", "executor-crm"


class KillExecutorBilling(ServiceKill):
    kind, service = "kill:executor-billing", "executor-billing"


class KillReconciler(ServiceKill):
    kind, service = "kill:reconciler", "reconciler"


class PausedWorker(Fault):
    """An executor stops itself (SIGSTOP) at a fault point of its next call and stays stopped
    past its lease (issue 37): the reconciler takes its command over (fencing the provider
    first), and when it resumes its late call is refused or its late answer recorded — never
    a silent contradiction (checker.no_silent_contradiction)."""

    service: ClassVar[str]
    point: ClassVar[str]
    # Past the 4 s lease, the 2 s call bound and a reconciler period, so the take-over comes.
    hold_s = (8.0, 20.0)

    def inject(self) -> str:
        p = self.target.p
        harness.restart(p, self.service, f"{self.point}:pause:1")
        svc = p.services[self.service]
        assert svc.proc is not None
        pid = svc.proc.pid
        # Positive marker: it stopped itself there (the load sends it work every few seconds).
        if not wait_until(lambda: harness.stopped(pid), timeout=ANSWER_LOST_S):
            raise NotStruck(f"{self.service} never reached {self.point}")
        self._pid = pid
        return f"pid {pid} stopped at {self.point}"

    def heal(self) -> str:
        p = self.target.p
        svc = p.services[self.service]
        pid = getattr(self, "_pid", None)
        if pid is not None and harness.stopped(pid):
            os.kill(pid, signal.SIGCONT)
            # Its call and its record run now; then it is restarted unarmed.
            wait_until(lambda: "event=late_answer" in svc.log.read_text(errors="replace")
                       or "event=dispatched" in svc.tail(5), timeout=30)
        harness.restart(p, self.service, None)
        assert svc.proc is not None and svc.alive(), svc.tail()
        return f"resumed, then restarted unarmed as pid {svc.proc.pid}"


class PauseBillingBeforeCall(PausedWorker):
    kind, service, point = ("pause:executor-billing:before-call", "executor-billing",
                            "executor.before_call")


class PauseBillingAfterAnswer(PausedWorker):
    kind, service, point = ("pause:executor-billing:after-answer", "executor-billing",
                            "executor.after_remote_write")


class PauseCrmBeforeCall(PausedWorker):
    kind, service, point = ("pause:executor-crm:before-call", "executor-crm",
                            "executor.before_call")


class BrokerFault(Fault):
    """One broker of three away; the pipeline's partitions it led move to the others."""

    hold_s = (5.0, 15.0)
    victim: int | None = None

    def _led(self, node: int) -> list[str]:
        cluster, ns = self.target.cluster, self.target.p.ns
        led = []
        for topic in cluster.admin().list_topics(timeout=10).topics:
            if topic.startswith(ns):
                for i, state in (cluster.partitions(topic) or {}).items():
                    if state.leader == node:
                        led.append(f"{topic}[{i}]")
        return led

    def _strike(self, stop: bool) -> str:
        cluster = self.target.cluster
        self.victim = self.rng.choice(BROKERS)
        led = self._led(self.victim)
        (cluster.stop if stop else cluster.kill)(self.victim)
        if cluster.alive(self.victim):
            raise NotStruck(f"broker {self.victim} still running")
        # Positive marker: the controller moved every partition it led to another broker.
        moved = wait_until(lambda: not any(
            (found := cluster.partition(*_split(t))) is None or found.leader == self.victim
            for t in led), timeout=FAILOVER_S)
        if not moved:
            raise NotStruck(f"broker {self.victim} down, its partitions {led} not re-led")
        return f"broker {self.victim} down; {len(led)} partitions it led have new leaders"

    def heal(self) -> str:
        if self.victim is None:
            return "nothing to heal"
        cluster = self.target.cluster
        cluster.start(self.victim)  # returns once the broker is unfenced
        node = self.victim

        def in_sync() -> bool:
            topics = [t for t in cluster.admin().list_topics(timeout=10).topics
                      if t.startswith(self.target.p.ns)]
            return all(found is not None and all(node in s.isr for s in found.values())
                       for found in (cluster.partitions(t) for t in topics))
        if not wait_until(in_sync, timeout=FAILOVER_S * 2):
            raise AssertionError(f"broker {node} restarted, never back in sync")
        return f"broker {node} back, in every ISR"


def _split(name: str) -> tuple[str, int]:
    topic, part = name[:-1].rsplit("[", 1)
    return topic, int(part)


class BrokerKill(BrokerFault):
    kind = "broker:kill"

    def inject(self) -> str:
        return self._strike(stop=False)


class BrokerStop(BrokerFault):
    kind = "broker:stop"

    def inject(self) -> str:
        return self._strike(stop=True)


def _start_time(url: str) -> object:
    conn = psycopg2.connect(url, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_postmaster_start_time()")
            row = cur.fetchone()
            return row[0] if row else None
    finally:
        conn.close()


def _answers(url: str) -> bool:
    try:
        _start_time(url)
    except psycopg2.Error:
        return False
    return True


class PrimaryRestart(Fault):
    """The ledger's primary crashes (immediate stop: no checkpoint) and starts again."""

    kind = "postgres:primary-restart"
    hold_s = (1.0, 5.0)
    before: object = None

    def inject(self) -> str:
        pair = self.target.pair
        self.before = _start_time(pair.primary_url)
        pair.primary("stop", "immediate")
        if _answers(pair.primary_url):
            raise NotStruck("the primary still answers")
        return "primary refuses connections"

    def heal(self) -> str:
        pair = self.target.pair
        pair.primary("start")
        started = _start_time(pair.primary_url)
        if self.before is not None and started == self.before:
            raise AssertionError("the primary was never restarted")
        if not wait_until(lambda: pair.replication() == ("streaming", "sync"), timeout=120):
            raise AssertionError(f"standby not synchronous again: {pair.replication()}")
        return f"primary up since {started}, standby streaming sync"


class StandbyStall(Fault):
    """The synchronous standby frozen (SIGSTOP): every commit of the primary parks."""

    kind = "postgres:standby-stall"
    hold_s = (3.0, 12.0)

    def __init__(self, target: Target, rng: random.Random) -> None:
        super().__init__(target, rng)
        self._frozen = ExitStack()

    def inject(self) -> str:
        pair = self.target.pair
        self._frozen.enter_context(pair.stalled())
        if not wait_until(lambda: bool(pair.parked()), timeout=PARKED_S):
            raise NotStruck("no commit waited for the stalled standby")
        return f"commits parked on SyncRep: {pair.parked()[:3]}"

    def heal(self) -> str:
        self._frozen.close()  # SIGCONT to every process it stopped
        pair = self.target.pair
        if not wait_until(lambda: pair.replication() == ("streaming", "sync"), timeout=120):
            raise AssertionError(f"standby not synchronous again: {pair.replication()}")
        return "standby running, streaming sync"


class StandbyKill(Fault):
    """The synchronous standby crashes (immediate stop) and is restarted."""

    kind = "postgres:standby-kill"
    hold_s = (2.0, 8.0)

    def inject(self) -> str:
        pair = self.target.pair
        pair.standby("stop", "immediate")
        if not wait_until(lambda: pair.replication() is None, timeout=30):
            raise NotStruck(f"the primary still sees its standby: {pair.replication()}")
        return "the primary sees no standby"

    def heal(self) -> str:
        pair = self.target.pair
        pair.standby("start")  # returns once it is streaming and synchronous again
        if pair.replication() != ("streaming", "sync"):
            raise AssertionError(f"standby not synchronous again: {pair.replication()}")
        return "standby restarted, streaming sync"


class AnswerLost(Fault):
    """A provider commits a write and its answer never arrives (the connection closes with no
    response): keyed CRM notes and contact updates are concluded by the reconciler's lookup;
    a refund (contract ``none``, no lookup) stays ``unknown``, never resent."""

    hold_s = (0.0, 0.0)
    method: ClassVar[str] = "POST"
    path_prefix: ClassVar[str]

    def inject(self) -> str:
        crm = self.target.p.crm
        match = {"method": self.method, "path_prefix": self.path_prefix}
        asyncio.run(crm.arm({"match": match, "action": "drop_after_commit", "times": 1}))
        # Positive marker: the rule was used up, i.e. a matching write committed and its
        # answer was dropped (the load sends such writes every few seconds).
        if not wait_until(lambda: not asyncio.run(crm.armed()), timeout=ANSWER_LOST_S):
            raise NotStruck(f"no {self.method} {self.path_prefix} in {ANSWER_LOST_S:.0f} s")
        return f"a {self.method} {self.path_prefix} committed, its answer dropped"

    def heal(self) -> str:
        asyncio.run(self.target.p.crm.disarm())
        return "no fault armed at the provider"


class NoteAnswerLost(AnswerLost):
    kind = "provider:note-answer-lost"
    path_prefix = "/v1/customers/"


class RefundAnswerLost(AnswerLost):
    kind = "provider:refund-answer-lost"
    path_prefix = "/v1/refunds"


class ProviderCut(Fault):
    """The provider's link cut silently (every packet dropped, no RST): calls in flight stall
    and either finish once TCP retransmits after the heal or meet the call bound and are in
    doubt; admission's target look-ups and the reconciler's lookups fail meanwhile."""

    kind = "link:provider-cut"
    # Around the connectors' call bound: some calls survive the cut, some are in doubt.
    hold_s = (2.0, 20.0)

    @classmethod
    def available(cls, target: Target) -> bool:
        return target.crm_ns is not None

    def inject(self) -> str:
        ns = self.target.crm_ns
        assert ns is not None
        before = ns.dropped()
        ns.cut()
        # Positive marker: traffic to or from the provider was dropped (the load calls it
        # every few seconds), not an idle link cut.
        if not wait_until(lambda: ns.dropped() > before, timeout=60):
            raise NotStruck("no packet of the provider was dropped in 60 s")
        return f"provider cut off; {ns.dropped() - before} packets dropped so far"

    def heal(self) -> str:
        ns = self.target.crm_ns
        if ns is None:
            return "nothing to heal"
        ns.heal()
        ready = processes.http_ok(f"{self.target.p.crm.url}/readyz")
        if not wait_until(ready, timeout=60):
            raise AssertionError("the provider does not answer after the heal")
        return "provider reachable, /readyz answers"


REGISTRY: tuple[type[Fault], ...] = (
    KillRelay, KillAdmission, KillExecutorCrm, KillExecutorBilling, KillReconciler,
    BrokerKill, BrokerStop, PrimaryRestart, StandbyStall, StandbyKill,
    NoteAnswerLost, RefundAnswerLost, ProviderCut,
    PauseBillingBeforeCall, PauseBillingAfterAnswer, PauseCrmBeforeCall)
