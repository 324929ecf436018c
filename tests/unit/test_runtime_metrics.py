"""The runtime counters the alert rules read (issue 23): each counts once per event, labelled.

Each test swaps the module-level counter for the same definition on a private meter provider
with an in-memory reader (OpenTelemetry's global provider can be set once per process), then
drives the real code path: ``handling.guarded`` / ``dead_letter``, the batch runner, the
reconciler's take-over and both ``retry_capped`` branches. The ledger and the broker are
stand-ins here; tests/integration/test_executor.py and test_kafka_batch.py read the same
counters on the real ones.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from dataclasses import replace as dataclasses_replace
from datetime import UTC, datetime, timedelta
from typing import Any

import confluent_kafka
import pytest

from agentledger import errors
from agentledger.connectors import base
from agentledger.executor import dispatcher, reconciler
from agentledger.kafka import batch, handling
from agentledger.ledger import dispatch, repository
from tests.helpers import Points


def _labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


# ----------------------------------------------------------------------------- dead letters
@dataclass
class _Raw:
    _topic: str
    _offset: int = 7

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"\x00{not json"


@dataclass
class _Message:
    raw_message: _Raw


@dataclass
class _Broker:
    fail: bool = False
    published: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    async def publish(self, _body: bytes, *, topic: str, key: bytes | None,
                      headers: dict[str, str]) -> None:
        if self.fail:
            raise errors.AnswersUndelivered("the broker is away")
        self.published.append((topic, headers))


def test_a_topic_family_is_a_known_name_or_other() -> None:
    assert handling.topic_family("agent.proposals.v1") == "agent.proposals"
    assert handling.topic_family("agent.proposals.t1a2b3c4.v1") == "agent.proposals"
    assert handling.topic_family("gateway.proposals.v1") == "gateway.proposals"
    assert handling.topic_family("exec.billing.v1") == "exec"
    for unknown in ("t0123456789.batch.v1", "exec.v1", "x", "", "Agent.Proposals.v1"):
        assert handling.topic_family(unknown) == "other", unknown


async def test_a_guarded_poison_message_is_dead_lettered_and_counted_once(
    recorded: Callable[[str], Points],
) -> None:
    points = recorded("dead_letters")
    broker = _Broker()

    async def handle(_msg: Any) -> None:
        raise errors.PoisonMessage("no JSON here")

    run = handling.guarded(broker, handle, payload_topic=True)  # type: ignore[arg-type]
    await run(_Message(_Raw("agent.proposals.v1")))  # type: ignore[arg-type]
    assert broker.published == [("agent.proposals.dlq.v1", {"error_code": "poison_message"})]
    assert points() == {_labels(**{"topic.family": "agent.proposals",
                                   "outcome": "poison_message"}): 1}


async def test_a_retryable_failure_or_an_undelivered_dead_letter_counts_nothing(
    recorded: Callable[[str], Points],
) -> None:
    points = recorded("dead_letters")

    async def outage(_msg: Any) -> None:
        raise errors.StorageError("the database is away")

    run = handling.guarded(_Broker(), outage)  # type: ignore[arg-type]
    with pytest.raises(errors.StorageError):  # redelivered, not dead-lettered
        await run(_Message(_Raw("agent.requests.v1")))  # type: ignore[arg-type]
    with pytest.raises(errors.AnswersUndelivered):  # not published: not counted
        await handling.dead_letter(_Broker(fail=True), _Message(_Raw("agent.requests.v1")),  # type: ignore[arg-type]
                                   errors.PoisonMessage("bad"))
    assert points() == {}


@dataclass
class _Record:
    _topic: str
    _offset: int
    _value: bytes

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return b"k"

    def headers(self) -> list[tuple[str, bytes]]:
        return []

    def error(self) -> None:
        return None


@dataclass
class _Consumer:
    batches: list[list[_Record]]

    def poll(self, _timeout: float) -> _Record | None:
        return self.batches[0].pop(0) if self.batches and self.batches[0] else None

    def consume(self, _n: int, _timeout: float) -> list[_Record]:
        rest, self.batches = self.batches[0], self.batches[1:]
        return rest

    def commit(self, **_kwargs: Any) -> None:
        pass

    def seek(self, _tp: confluent_kafka.TopicPartition) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class _Producer:
    fail: list[bool]  # per flush: whether its deliveries fail
    sent: list[str] = field(default_factory=list)
    _reports: list[Any] = field(default_factory=list)

    def produce(self, topic: str, _value: bytes, _key: bytes | None, *, headers: Any,
                on_delivery: Any) -> None:
        self.sent.append(topic)
        self._reports.append(on_delivery)

    def flush(self, _timeout: float) -> int:
        fail = self.fail.pop(0) if self.fail else False
        for report in self._reports:
            report("broker says no" if fail else None, None)
        self._reports.clear()
        return 0

    def poll(self, _timeout: float) -> int:
        return 0


def _batch_runner(records: list[list[_Record]], producer: _Producer,
                  handle: Any) -> batch.BatchConsumer[dict[str, Any]]:
    consumer = _Consumer(records)
    return batch.BatchConsumer(
        lambda: consumer, producer,  # type: ignore[arg-type,return-value]
        batch.Handler(parse=lambda m: json.loads(m.value() or b""), handle=handle),
        pauses_s=(0.0,))


async def _answer(item: dict[str, Any], _msg: Any) -> list[batch.Output]:
    if item.get("bug"):
        raise KeyError("a handler bug")  # not retryable: dead-lettered
    return [batch.Output("answers", b"ok")]


async def test_the_batch_runner_counts_each_dead_letter_once_it_is_delivered(
    recorded: Callable[[str], Points],
) -> None:
    points = recorded("dead_letters")
    topic = "exec.crm.v1"
    records = [_Record(topic, 0, b'{"name": "ok"}'), _Record(topic, 1, b"\x00{not json"),
               _Record(topic, 2, b'{"bug": true}')]
    # The first publish fails: the batch is redelivered whole, and only then delivered.
    producer = _Producer(fail=[True, False])
    runner = _batch_runner([records, [*records]], producer, _answer)
    assert await runner.step() == 3
    assert points() == {}  # decided, but nothing reached the dead-letter topic
    assert await runner.step() == 3
    assert producer.sent.count("exec.crm.dlq.v1") == 4  # two per attempt of the batch
    assert points() == {
        _labels(**{"topic.family": "exec", "outcome": "poison_message"}): 1,
        _labels(**{"topic.family": "exec", "outcome": "agentledger_error"}): 1,
    }


async def test_a_dead_letter_behind_a_rewind_counts_when_it_is_finally_sent(
    recorded: Callable[[str], Points],
) -> None:
    points = recorded("dead_letters")
    topic = "agent.proposals.v1"
    attempts: list[int] = []

    async def handle(item: dict[str, Any], msg: Any) -> list[batch.Output]:
        if item.get("outage") and not attempts:
            attempts.append(1)
            raise errors.StorageError("once")
        return []

    first = [_Record(topic, 0, b'{"outage": true}'), _Record(topic, 1, b"not json")]
    runner = _batch_runner([first, [*first]], _Producer(fail=[]), handle)
    await runner.step()
    assert points() == {}  # offset 1 is redelivered after offset 0: not published yet
    await runner.step()
    assert points() == {_labels(**{"topic.family": "agent.proposals",
                                   "outcome": "poison_message"}): 1}


# ----------------------------------------------------------------------------- executor
class _Pool:
    """A pool whose connections are never used: the ledger calls are replaced below."""

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[object]:
        yield object()


@dataclass
class _Connector:
    contract: base.Contract
    name: str = "crm"


def _claim(previous: str, generation: int = 3) -> dispatch.Claim:
    return dispatch.Claim(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), "recovery", generation,
                          datetime.now(UTC) + timedelta(seconds=30), uuid.uuid4(), previous)


def _ledger(monkeypatch: pytest.MonkeyPatch, held: dispatch.Claim | None, requeued: str) -> None:
    async def claim(*_a: Any, **_k: Any) -> dispatch.Claim | None:
        return held

    async def requeue(*_a: Any, **_k: Any) -> str:
        return requeued

    async def nothing(*_a: Any, **_k: Any) -> list[Any]:
        return []

    async def load_command(*_a: Any, **_k: Any) -> dict[str, Any]:
        return {"connector": "crm", "lease_until": datetime.now(UTC) - timedelta(minutes=5),
                "action": "crm.note.create", "resource_id": "cust-a", "expected_revision": None,
                "fencing_generation": 3}

    monkeypatch.setattr(dispatch, "claim", claim)
    monkeypatch.setattr(dispatch, "requeue", requeue)
    monkeypatch.setattr(dispatch, "attempts", nothing)
    monkeypatch.setattr(dispatch, "finalize", nothing)
    monkeypatch.setattr(dispatch, "may_still_act", lambda *_a: False)
    monkeypatch.setattr(dispatch, "never_sent", lambda *_a: True)
    monkeypatch.setattr(repository, "load_command", load_command)


class _NoCredentials:
    def token(self, _connector: str, _tenant_id: uuid.UUID) -> None:
        return None  # a lookup without a credential is in doubt: `unknown`, no call


def _reconciler() -> reconciler.Reconciler:
    contract = base.Contract("keyed", lookup=True, call_timeout_s=5.0)
    return reconciler.Reconciler(
        pool=_Pool(), connectors={"crm": _Connector(contract)},  # type: ignore[arg-type,dict-item]
        credentials=_NoCredentials(), worker_id="recovery")  # type: ignore[arg-type]


@pytest.mark.parametrize("requeued", ["requeued", "capped"])
async def test_a_take_over_of_a_dispatching_command_counts_one_expired_lease(
    recorded: Callable[[str], Points], monkeypatch: pytest.MonkeyPatch, requeued: str,
) -> None:
    expired, capped = recorded("leases_expired"), recorded("retries_capped")
    held = _claim("dispatching")
    _ledger(monkeypatch, held, requeued)
    done = await _reconciler()._reconcile(held.tenant_id, held.operation_id, "crm", "dispatching")
    assert done == ("requeued" if requeued == "requeued" else "unknown")
    assert expired() == {_labels(connector="crm"): 1}
    assert capped() == ({_labels(connector="crm"): 1} if requeued == "capped" else {})


async def test_recovering_an_unknown_command_or_claiming_nothing_is_no_expired_lease(
    recorded: Callable[[str], Points], monkeypatch: pytest.MonkeyPatch,
) -> None:
    expired = recorded("leases_expired")
    held = _claim("unknown")
    _ledger(monkeypatch, held, "requeued")
    assert await _reconciler()._reconcile(held.tenant_id, held.operation_id, "crm",
                                          "unknown") == "unknown"
    _ledger(monkeypatch, None, "requeued")  # the claim went to someone else
    assert await _reconciler()._reconcile(held.tenant_id, held.operation_id, "crm",
                                          "dispatching") == "skipped"
    assert expired() == {}


@pytest.mark.parametrize("requeued", ["requeued", "capped"])
async def test_the_executor_counts_a_retry_cap_once_with_its_connector(
    recorded: Callable[[str], Points], monkeypatch: pytest.MonkeyPatch, requeued: str,
) -> None:
    capped = recorded("retries_capped")
    held = _claim("pending", generation=10)
    _ledger(monkeypatch, held, requeued)
    worker = dispatcher.Dispatcher(
        pool=_Pool(), connectors={}, credentials=None, cipher=None,  # type: ignore[arg-type]
        authorizer=None, allowlist=None, worker_id="w1")  # type: ignore[arg-type]
    state = await worker.record(held, base.NotSent("connection refused"), connector="crm")
    assert state == ("pending" if requeued == "requeued" else "unknown")
    assert capped() == ({_labels(connector="crm"): 1} if requeued == "capped" else {})


async def test_one_items_exception_never_ends_a_sweep(
    recorded: Callable[[str], Points], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 38 class 2: on 85a9f05 an exception in one item ended the whole sweep, so every
    # later item of the period waited (and the failing one looped with no cap).
    from agentledger.approvals import repository as approvals_repo
    from agentledger.ledger import late

    failures = recorded("sweep_failures")
    broken, healthy = uuid.uuid4(), uuid.uuid4()
    tenant = uuid.uuid4()

    async def nothing(*_a: Any, **_k: Any) -> list[Any]:
        return []

    async def due(*_a: Any, **_k: Any) -> list[dict[str, Any]]:
        return [{"tenant_id": tenant, "operation_id": op, "connector": "crm",
                 "state": "dispatching"} for op in (broken, healthy)]

    async def reconcile(self: reconciler.Reconciler, tenant_id: uuid.UUID, op: uuid.UUID,
                        connector: str, state: str) -> str:
        if op == broken:
            raise ValueError("a value nobody expected")
        return "requeued"

    async def count(*_a: Any, **_k: Any) -> None:
        return None

    monkeypatch.setattr(approvals_repo, "expire_due", nothing)
    monkeypatch.setattr(dispatch, "needs_reconciliation", due)
    monkeypatch.setattr(dispatch, "stranded_pending", nothing)
    monkeypatch.setattr(late, "late_applied", nothing)
    monkeypatch.setattr(reconciler.Reconciler, "reconcile", reconcile)
    monkeypatch.setattr(reconciler.Reconciler, "count_unknown", count)
    done = await _reconciler().sweep()
    assert done == {broken: "failed", healthy: "requeued"}
    assert failures() == {_labels(connector="crm"): 1}


async def test_a_take_over_at_the_cap_holds_the_command_for_an_operator(
    recorded: Callable[[str], Points], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 38 class 2: the take-over branch had no generation cap of its own.
    capped = recorded("retries_capped")
    held = _claim("dispatching", generation=10)
    _ledger(monkeypatch, held, "requeued")
    monkeypatch.setattr(dispatch, "never_sent", lambda *_a: False)
    finalized: list[tuple[str, str | None]] = []

    async def finalize(_conn: Any, _held: Any, state: str, **k: Any) -> None:
        finalized.append((state, k.get("reason")))

    async def record_fence(*_a: Any, **_k: Any) -> None:
        return None

    monkeypatch.setattr(dispatch, "finalize", finalize)
    monkeypatch.setattr(dispatch, "record_fence", record_fence)
    done = await _reconciler()._reconcile(held.tenant_id, held.operation_id, "crm", "dispatching")
    assert done == "unknown"
    assert [s for s, _ in finalized] == ["unknown"]
    assert str(finalized[0][1]).startswith("retry cap: 10 dispatch generations")
    assert capped() == {_labels(connector="crm"): 1}


async def test_a_finalize_that_fails_on_the_database_is_tried_again_while_the_claim_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 41 §6: a database blip under the finalize left the command to its lease and the
    # reconciler (~76 s for a 5 s restart); the worker that holds the claim finishes it.
    held = _claim("pending")
    calls: list[str] = []

    async def final_rows(_conn: Any, _tenant: Any, rows: Any) -> list[bool]:
        calls.extend(r.state for r in rows)
        if len(calls) < 3:
            raise errors.StorageError("connection refused: the database is restarting")
        return [True] * len(rows)

    monkeypatch.setattr(dispatcher, "_final_rows", final_rows)
    monkeypatch.setattr(dispatcher, "RETRY_FIRST_S", 0.01)
    worker = dispatcher.Dispatcher(
        pool=_Pool(), connectors={}, credentials=None, cipher=None,  # type: ignore[arg-type]
        authorizer=None, allowlist=None, worker_id="w1")  # type: ignore[arg-type]
    assert await worker.record(held, base.Applied("crm:note:1"), connector="crm") == "succeeded"
    assert calls == ["succeeded"] * 3


async def test_a_pre_call_mark_is_never_retried_past_the_claims_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Never send on an expired lease: the mark's retries end with the lease (less a margin);
    # only an outcome already given is retried past it (tests/unit/test_outcome_retry.py).
    held = dataclasses_replace(_claim("pending"), lease_until=datetime.now(UTC))
    marks: list[object] = []
    sent: list[object] = []

    async def mark_rows(_conn: Any, _tenant: Any, rows: Any) -> list[datetime | None]:
        marks.extend(rows)
        raise errors.StorageError("still down")

    async def execute(*a: Any, **_k: Any) -> base.Result:
        sent.append(a)
        return base.Applied("crm:note:1")

    monkeypatch.setattr(dispatcher, "_mark_rows", mark_rows)
    monkeypatch.setattr(dispatcher.boundary, "execute", execute)
    worker = dispatcher.Dispatcher(
        pool=_Pool(), connectors={}, credentials=None, cipher=None,  # type: ignore[arg-type]
        authorizer=None, allowlist=None, worker_id="w1", call_timeout_s=1.0)  # type: ignore[arg-type]
    call = base.Call(held.tenant_id, held.operation_id, "crm.note.create", "c1", {}, None)
    with pytest.raises(errors.StorageError):
        await worker._attempt(_Connector(base.Contract("keyed", call_timeout_s=1.0)),  # type: ignore[arg-type]
                              call, "token", held, "dispatch", None)
    assert len(marks) == 1  # the lease has no time left: the reconciler's now
    assert sent == []  # and nothing was sent
