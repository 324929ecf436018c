"""The soak: the stack, the load and the approver, the observers and the fault scheduler for
N minutes; then the load stops, the system settles, the checker runs over the history and
the final snapshot, and the report is written.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentledger import settings
from agentledger.testing.pipeline import Pipeline
from agentledger.testing.polling import wait_until
from tests.chaos import harness
from tests.soak import checker, faults, load, observe, report
from tests.soak import history as history_mod
from tests.soak.history import History
from tests.soak.stack import SERVICES, soak_stack
from tests.soak.worker import Worker

# Pause between two faults (drawn uniformly): the pipeline shows it carries on in between.
GAP_S = (4.0, 12.0)
# No fault starts this close to the end of the load: a broker's heal (start, then back in
# every ISR) takes up to a minute on this box, and the load should end on a whole stack.
LAST_FAULT_S = 45.0
# After the load stops: the bound for every command to settle, the outbox to drain and the
# executors to handle every exec record (leases, reconciler passes, relay and executor
# rounds after the last fault's heal, on a loaded 2-core box).
SETTLE_S = 240.0


@dataclass
class Scheduler(Worker):
    """One fault at a time from the registry, in a seeded order (each kind once per round,
    so a short run still meets every kind); a service that died on its own is restarted, as
    its supervisor would, and recorded."""

    target: faults.Target
    history: History
    seed: int
    until: float  # time.monotonic() when the load ends
    injected: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Only these fault kinds (``--faults``; empty: every kind the machine can inject).
    kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.rng = random.Random(f"faults:{self.seed}")
        Worker.__init__(self, "soak-faults")

    join_s = 600.0  # ``stop`` returns once the fault in progress has healed

    def _run(self) -> None:
        bag: list[type[faults.Fault]] = []
        while not self._stop.is_set():
            if self._pause(self.rng.uniform(*GAP_S)):
                return
            if time.monotonic() + LAST_FAULT_S > self.until:
                continue  # supervising only, until the load ends
            if not bag:
                bag = [f for f in faults.REGISTRY if f.available(self.target)
                       and (not self.kinds or f.kind in self.kinds)]
                self.rng.shuffle(bag)
            try:
                self.strike(bag.pop()(self.target, self.rng))
            except Exception as exc:  # reported in the soak's result; the soak goes on
                self.errors.append(repr(exc)[:500])
                self.history.append("phase", name="fault_error", error=repr(exc)[:500])

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` (pacing, not a condition), supervising; True once stopping."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            supervise(self.target.p, self.history)
            self._stop.wait(min(1.0, max(0.0, deadline - time.monotonic())))
        return self._stop.is_set()

    def strike(self, fault: faults.Fault) -> None:
        self.history.append("fault", phase="inject", fault=fault.kind)
        try:
            marker = fault.inject()
            self.injected.append(fault.kind)
            self.history.append("fault", phase="struck", fault=fault.kind, marker=marker)
            # The fault left in place while the load meets it (pacing, not a condition).
            self._stop.wait(self.rng.uniform(*fault.hold_s))
        finally:
            self.history.append("fault", phase="heal", fault=fault.kind)
            healed = fault.heal()
            self.history.append("fault", phase="healed", fault=fault.kind, marker=healed)
            supervise(self.target.p, self.history)


def supervise(p: Pipeline, history: History) -> None:
    """Restart any service that exited on its own (the supervisor's job in production)."""
    for name in SERVICES:
        svc = p.services[name]
        if svc.proc is not None and not svc.alive():
            history.append("service_exit", service=name, rc=svc.proc.returncode,
                           tail=svc.tail(5)[-800:])
            harness.restart(p, name, None)


def settle(p: Pipeline, history: History, poller: observe.LedgerPoller,
           watcher: observe.TopicWatcher, acked: set[str]) -> bool:
    """Every acknowledged proposal answered, every command settled (terminal, or ``unknown``
    as its contract allows), no request awaiting a decision, the outbox drained, every exec
    record handled, and the poller saw the end — or the deadline (the checker then reports
    what never settled)."""
    rounds = poller.rounds
    contracts = observe.contracts(p)

    def done() -> bool:
        supervise(p, history)
        found, asked = observe.commands(p), observe.approvals(p)
        if any(op not in found and op not in asked and op not in watcher.refused for op in acked):
            return False
        return (all(checker.settled(cmd, contracts) for cmd in found.values())
                and "pending" not in asked.values() and harness.outbox_rows(p) == 0
                and harness.exec_lag(p) == 0 and poller.rounds > rounds)
    ok = wait_until(done, timeout=SETTLE_S, interval=1.0)
    history.append("phase", name="settled" if ok else "not_settled")
    return ok


# The capacity burst before a soak at load: notes proposed at once, and its bound.
CAPACITY_N = 400
CAPACITY_TIMEOUT_S = 300.0


def run(minutes: float, seed: int, out: Path, kinds: tuple[str, ...] = (), *,
        load_share: float | None = None, evidence: Path | None = None) -> int:
    """One soak; the exit code: 0 when every invariant held. ``load_share``: the soak at load —
    the box's burst capacity is measured on the soak's own stack first, then the load runs
    at that share of it; ``evidence``: also write the report there (paths relative to the
    repository, with the rate, the capacity and the recovery after each fault kind)."""
    history = History(out / "soak" / "history.jsonl")
    logs = Path(tempfile.mkdtemp(prefix="al-soak-logs-"))
    started = time.monotonic()
    data: dict[str, Any] = {"ok": False}
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, logs, True)
        stack.callback(history.close)
        history.append("phase", name="stack_starting", seed=seed, minutes=minutes)
        s = stack.enter_context(soak_stack(logs))
        p = s.p
        history.append("phase", name="stack_ready", ns=p.ns, tenant=p.tenant)
        poller, watcher = observe.LedgerPoller(p, history), observe.TopicWatcher(p, history)
        approver = load.Approver(p, history, seed)
        capacity_per_s = rate = None
        if load_share is not None:
            for part in (poller, watcher):
                part.start()
            capacity_per_s = load.capacity(p, history, CAPACITY_N, CAPACITY_TIMEOUT_S)
            rate = load_share * capacity_per_s
            print(f"soak: capacity {capacity_per_s:.1f}/s, load {rate:.1f}/s", flush=True)
        traffic = load.Load(p, history, seed, rate=rate)
        scheduler = Scheduler(faults.Target(p, s.cluster, s.pair, s.crm_ns), history, seed,
                              until=time.monotonic() + minutes * 60, kinds=kinds)
        parts: list[Worker] = [approver, traffic, scheduler]
        if load_share is None:  # else the observers started before the capacity burst
            parts = [poller, watcher, *parts]
        for part in parts:
            part.start()
        load_began = history.now()
        stack.callback(poller.stop)
        stack.callback(watcher.stop)
        stack.callback(approver.stop, 60)
        stack.callback(traffic.stop, 600)
        stack.callback(scheduler.stop)  # first out: the fault in progress heals first
        history.append("phase", name="load_started")
        threading.Event().wait(minutes * 60)  # the soak's length: pacing, not a condition
        scheduler.stop()
        history.append("phase", name="faults_stopped")
        traffic.stop(600)
        load_seconds = history.now() - load_began
        history.append("phase", name="load_stopped")
        acked = {str(r["operation_id"]) for r in history_mod.load(history.path)
                 if r["kind"] == "proposal" and r["acked"]}
        settled = settle(p, history, poller, watcher, acked)
        approver.stop(60)
        poller.stop()
        watcher.stop()
        records = history_mod.load(history.path)
        snap = observe.snapshot(p, acked)
        findings = checker.check(records, snap)
        data = report.write(out, minutes=minutes, seed=seed, history=records, snap=snap,
                     findings=findings, settled=settled,
                     errors=traffic.errors + approver.errors + scheduler.errors,
                     load_intact=not traffic.errors,
                     seconds=time.monotonic() - started, logs={
                         n: svc.tail(20) for n, svc in p.services.items()})
        if evidence is not None:
            write_evidence(evidence, data, records, load_began=load_began,
                           load_seconds=load_seconds,
                           capacity_per_s=capacity_per_s, rate=rate, load_share=load_share)
        if not data["ok"]:
            keep_evidence(out / "soak" / "evidence", logs, s.cluster.base)
    return 0 if data["ok"] else 1



def write_evidence(path: Path, data: dict[str, Any], records: list[dict[str, Any]], *,
                   load_began: float, load_seconds: float, capacity_per_s: float | None,
                   rate: float | None, load_share: float | None) -> None:
    """The soak's report for docs/evidence: the offered and admitted rates beside the box's
    measured capacity, and per fault kind how long the commands it caught took to finish."""
    # Admitted per second over the load alone (the capacity burst before it is not counted).
    during = {r["operation_id"] for r in records
              if r["kind"] == "proposal" and r.get("acked") and r["sent_t"] >= load_began}
    admitted = len(during & {r["operation_id"] for r in records if r["kind"] == "state"})
    root = settings.REPO_ROOT

    def relative(value: Any) -> Any:
        text = str(value)
        return text.replace(str(root) + "/", "") if text.startswith(str(root)) else value
    evidence = {
        "seconds": data["seconds"],
        "load_seconds": round(load_seconds),
        "capacity_per_s": None if capacity_per_s is None else round(capacity_per_s, 2),
        "load_share": load_share,
        "offered_per_s": None if rate is None else round(rate, 2),
        "rate_per_s": round(admitted / load_seconds, 2) if load_seconds else None,
        "admitted_during_load": admitted,
        "recovery_by_fault_kind": report.recovery(records),
        **{k: v for k, v in data.items() if k not in ("seconds", "service_logs")},
    }
    evidence["history"] = relative(evidence["history"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(evidence, indent=2, default=str) + "\n")


def keep_evidence(dest: Path, logs: Path, kafka_base: Path) -> None:
    """A failed run's evidence, kept before the private stack is removed: every service's log
    (the relay's with its acknowledgement trace: event id, partition and offset of each record
    Kafka acknowledged) and the brokers' logs and data, for ``kafka-dump-log`` to say what a
    partition held at the offset a record was acknowledged at."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(logs, dest / "services", dirs_exist_ok=True)
    shutil.copytree(kafka_base, dest / "kafka", symlinks=True, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("libs"))
