"""An outcome the provider already gave survives a database restart longer than the claim's
lease (issue 41 §6): its write is retried for a bounded time, fenced by the claim's token —
never by a lease this process cannot renew while the database is away — so a take-over still
refuses it, and an earlier try that committed unseen is not mistaken for one."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentledger import errors
from agentledger.connectors import base
from agentledger.executor import dispatcher
from agentledger.ledger import dispatch, repository, steps


class _Pool:
    """A pool whose connections are never used: the ledger calls are replaced."""

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[object]:
        yield object()


def _expired() -> dispatch.Claim:
    """A claim whose lease ran out while the database was away."""
    return dispatch.Claim(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), "w1", 3,
                          datetime.now(UTC) - timedelta(seconds=5), uuid.uuid4(), "pending")


def _worker() -> dispatcher.Dispatcher:
    return dispatcher.Dispatcher(
        pool=_Pool(), connectors={}, credentials=None, cipher=None,  # type: ignore[arg-type]
        authorizer=None, allowlist=None, worker_id="w1")  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatcher, "RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(dispatcher, "RETRY_MAX_S", 0.002)


async def test_a_known_outcome_is_recorded_after_a_restart_longer_than_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = _expired()
    rows: list[steps.FinalRow] = []

    async def final_rows(_conn: Any, _tenant: Any, batch: Any) -> list[bool]:
        rows.extend(batch)
        if len(rows) == 1:
            raise ConnectionRefusedError(111, "Connect call failed")  # the pool reconnecting
        if len(rows) < 4:
            raise errors.StorageError("the database system is starting up", sqlstate="57P03")
        return [True]

    monkeypatch.setattr(dispatcher, "_final_rows", final_rows)
    assert await _worker().record(held, base.Applied("crm:note:1"),
                                  connector="crm") == "succeeded"
    # The same row every time: the same claim token, the same attempt, the same outcome.
    assert {(r.held.token, r.held.attempt_id, r.state, r.receipt) for r in rows} == {
        (held.token, held.attempt_id, "succeeded", "crm:note:1")}
    assert len(rows) == 4


async def test_a_take_over_during_the_restart_still_refuses_the_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The token was replaced while the database was away: the retried write records nothing
    # and the worker is told it is stale (``complete`` then records its answer as late).
    held = _expired()
    tries: list[int] = []

    async def final_rows(_conn: Any, _tenant: Any, batch: Any) -> list[bool]:
        tries.append(len(batch))
        if len(tries) < 3:
            raise errors.StorageError("connection reset")
        return [False]  # the statement's token check found another claim

    async def attempts(*_a: Any) -> list[dict[str, Any]]:
        # The taken-over attempt is still open (sent, never closed): not ours to have closed.
        return [{"attempt_id": held.attempt_id, "finished_at": None, "result": None}]

    async def load_command(*_a: Any) -> dict[str, Any]:
        return {"state": "dispatching"}

    monkeypatch.setattr(dispatcher, "_final_rows", final_rows)
    monkeypatch.setattr(dispatch, "attempts", attempts)
    monkeypatch.setattr(repository, "load_command", load_command)
    with pytest.raises(errors.StaleClaim):
        await _worker().record(held, base.Applied("crm:note:1"), connector="crm")
    assert len(tries) == 3  # retried past the lease, refused by the token


async def test_a_commit_whose_answer_was_lost_is_not_mistaken_for_a_take_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first try committed, then the connection died before its answer: the retry finds
    # the claim released. Our own attempt closed with our result says the outcome is ours.
    held = _expired()
    tries: list[int] = []

    async def final_rows(_conn: Any, _tenant: Any, batch: Any) -> list[bool]:
        tries.append(len(batch))
        if len(tries) == 1:
            raise errors.StorageError("ledger connection lost under COMMIT")
        return [False]

    async def attempts(*_a: Any) -> list[dict[str, Any]]:
        return [{"attempt_id": uuid.uuid4(), "finished_at": None, "result": None},
                {"attempt_id": held.attempt_id, "finished_at": datetime.now(UTC),
                 "result": "succeeded"}]

    async def load_command(*_a: Any) -> dict[str, Any]:
        return {"state": "succeeded"}

    monkeypatch.setattr(dispatcher, "_final_rows", final_rows)
    monkeypatch.setattr(dispatch, "attempts", attempts)
    monkeypatch.setattr(repository, "load_command", load_command)
    assert await _worker().record(held, base.Applied("crm:note:1"),
                                  connector="crm") == "succeeded"


async def test_a_first_try_refused_is_stale_without_a_second_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No earlier try could have committed: a refusal on the first try is a take-over.
    held = _expired()

    async def final_rows(_conn: Any, _tenant: Any, batch: Any) -> list[bool]:
        return [False]

    async def attempts(*_a: Any) -> list[dict[str, Any]]:
        raise AssertionError("no second look after a first-try refusal")

    monkeypatch.setattr(dispatcher, "_final_rows", final_rows)
    monkeypatch.setattr(dispatch, "attempts", attempts)
    with pytest.raises(errors.StaleClaim):
        await _worker().record(held, base.Applied("crm:note:1"), connector="crm")


async def test_the_outcome_retry_is_bounded_and_data_errors_are_never_retried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    held = _expired()
    tries: list[int] = []

    async def down(_conn: Any, _tenant: Any, batch: Any) -> list[bool]:
        tries.append(1)
        raise errors.StorageError("still down")

    monkeypatch.setattr(dispatcher, "_final_rows", down)
    monkeypatch.setattr(dispatcher, "OUTCOME_RETRY_S", 0.05)
    with pytest.raises(errors.StorageError):
        await _worker().record(held, base.Applied("crm:note:1"), connector="crm")
    assert len(tries) >= 2
    assert "event=outcome_unrecorded" in caplog.text  # logged, never silent

    tries.clear()

    async def rejected(_conn: Any, _tenant: Any, batch: Any) -> list[bool]:
        tries.append(1)
        raise errors.DataRejected("invalid byte sequence", sqlstate="22021")

    monkeypatch.setattr(dispatcher, "_final_rows", rejected)
    monkeypatch.setattr(dispatcher, "OUTCOME_RETRY_S", 60.0)
    with pytest.raises(errors.DataRejected):
        await _worker().record(held, base.Applied("crm:note:1"), connector="crm")
    assert len(tries) == 1  # SQLSTATE class 22: a property of the statement, never retried


async def test_an_error_that_is_not_the_database_is_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = _expired()
    tries: list[int] = []

    async def broken(_conn: Any, _tenant: Any, batch: Any) -> list[bool]:
        tries.append(1)
        raise KeyError("a bug, not an outage")

    monkeypatch.setattr(dispatcher, "_final_rows", broken)
    with pytest.raises(KeyError):
        await _worker().record(held, base.Applied("crm:note:1"), connector="crm")
    assert tries == [1]


class _Connector:
    name = "crm"
    contract = base.Contract("keyed", lookup=True, call_timeout_s=1.0)


def _resend_world(monkeypatch: pytest.MonkeyPatch, refused: int) -> tuple[list[str], list[str]]:
    """A first call in doubt; the resend's attempt writes refused ``refused`` times."""
    calls: list[str] = []
    writes: list[str] = []

    async def attempt(_self: Any, _c: Any, _call: Any, _t: Any, held: dispatch.Claim,
                      kind: str, _first: Any, **_k: Any) -> tuple[base.Result, Any]:
        calls.append(kind)
        if kind == "dispatch":
            return base.InDoubt("the call's bound ran out"), None
        return base.Applied("crm:note:1"), None

    async def finish_attempt(*_a: Any) -> None:
        writes.append("finish")
        if len(writes) <= refused:
            raise ConnectionRefusedError(111, "Connect call failed")

    async def new_attempt(_conn: Any, held: dispatch.Claim, **_k: Any) -> dispatch.Claim:
        writes.append("new")
        return held

    monkeypatch.setattr(dispatcher.Dispatcher, "_attempt", attempt)
    monkeypatch.setattr(dispatch, "finish_attempt", finish_attempt)
    monkeypatch.setattr(dispatch, "new_attempt", new_attempt)
    return calls, writes


async def test_a_resend_is_prepared_across_a_blip_while_the_lease_covers_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls, writes = _resend_world(monkeypatch, refused=2)
    held = dispatch.Claim(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), "w1", 3,
                          datetime.now(UTC) + timedelta(seconds=30), uuid.uuid4(), "pending")
    call = base.Call(held.tenant_id, held.operation_id, "crm.note.create", "c1", {}, None)
    result, _, stale = await _worker()._call(_Connector(), call, "t", held, None)  # type: ignore[arg-type]
    assert (result, stale) == (base.Applied("crm:note:1"), False)
    assert calls == ["dispatch", "resend"]
    assert writes == ["finish", "finish", "finish", "new"]


async def test_a_resend_is_never_prepared_past_the_lease_and_the_doubt_is_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The ledger is away and the lease ran out: no resend (it would need a mark on an expired
    # lease); the answer in doubt is what ``record`` then writes, as `unknown`.
    calls, writes = _resend_world(monkeypatch, refused=99)
    held = _expired()
    call = base.Call(held.tenant_id, held.operation_id, "crm.note.create", "c1", {}, None)
    result, _, stale = await _worker()._call(_Connector(), call, "t", held, None)  # type: ignore[arg-type]
    assert isinstance(result, base.InDoubt) and not stale
    assert calls == ["dispatch"] and writes == ["finish"]
