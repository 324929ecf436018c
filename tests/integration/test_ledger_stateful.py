"""A Hypothesis state machine over the real ledger: admit, replay, conflict, claim, finalize,
expire a lease, take over, requeue, resolve — with the invariants checked after every step."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from agentledger import errors
from agentledger.ledger import dispatch, repository, resolutions
from agentledger.testing.ledger import new_row as new_command

FINAL = st.sampled_from(["succeeded", "denied", "expired", "unknown", "review_required"])


class LedgerMachine(RuleBasedStateMachine):
    """Drives the ledger's public functions; a model tracks what must hold."""

    url: str = ""
    commands = Bundle("commands")
    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.conn: asyncpg.Connection = self.run(asyncpg.connect(self.url))
        self.tenant = uuid.uuid4()
        self.first_hash: dict[uuid.UUID, bytes] = {}
        self.generation: dict[uuid.UUID, int] = {}
        self.stale: list[dispatch.Claim] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.conn.close())
        self.loop.close()

    # ---- rules ----------------------------------------------------------------------------

    @rule(target=commands, body=st.text(min_size=1, max_size=20))
    def admit(self, body: str) -> uuid.UUID:
        cmd = new_command(self.tenant, body=body)
        assert self.run(repository.admit(self.conn, cmd)).status == "admitted"
        self.first_hash[cmd.operation_id] = cmd.request_hash
        return cmd.operation_id

    @rule(op=commands)
    def replay(self, op: uuid.UUID) -> None:
        cmd = dataclasses.replace(new_command(self.tenant, op), request_hash=self.first_hash[op])
        assert self.run(repository.admit(self.conn, cmd)).status == "replayed"

    @rule(op=commands, other=st.binary(min_size=32, max_size=32))
    def conflict(self, op: uuid.UUID, other: bytes) -> None:
        if other == self.first_hash[op]:
            return
        cmd = dataclasses.replace(new_command(self.tenant, op), request_hash=other)
        assert self.run(repository.admit(self.conn, cmd)).status == "conflict"

    @rule(target=claims, op=commands, worker=st.sampled_from(["w1", "w2"]))
    def claim(self, op: uuid.UUID, worker: str) -> dispatch.Claim | None:
        before = self.state(op)
        held = self.run(dispatch.claim(self.conn, self.tenant, op, worker_id=worker, lease_s=60,
                                       connectors=["crm"]))
        assert (held is not None) == (before == "pending"), before
        if held is not None:
            assert held.generation > self.generation.get(op, 0)
            self.generation[op] = held.generation
        return held

    @rule(held=consumes(claims), state=FINAL)
    def finalize(self, held: dispatch.Claim | None, state: str) -> None:
        if held is None:
            return
        receipt = "r-" + held.operation_id.hex[:8] if state == "succeeded" else None
        current = self.row(held.operation_id)
        try:
            self.run(dispatch.finalize(self.conn, held, state, receipt=receipt,  # type: ignore[arg-type]
                                       reason=None if receipt else "test"))
            assert current["claim_token"] == held.token  # only the holder may finalize
        except errors.StaleClaim:
            assert current["claim_token"] != held.token

    @rule(held=claims)
    def expire_and_take_over(self, held: dispatch.Claim | None) -> None:
        if held is None or self.state(held.operation_id) != "dispatching":
            return
        self.run(self.conn.execute(
            "UPDATE agent_command SET lease_until = now() - interval '1 second' "
            "WHERE tenant_id = $1 AND operation_id = $2", self.tenant, held.operation_id))
        new = self.run(dispatch.claim(self.conn, self.tenant, held.operation_id, worker_id="rec",
                                      lease_s=60, take_over=True, kind="lookup"))
        assert new is not None and new.generation > held.generation
        self.generation[held.operation_id] = new.generation
        self.stale.append(held)
        self.run(dispatch.requeue(self.conn, new, reason="lookup found nothing"))

    @rule()
    def stale_holders_cannot_finalize(self) -> None:
        for held in self.stale:
            with pytest.raises(errors.StaleClaim):
                self.run(dispatch.finalize(self.conn, held, "succeeded", receipt="forged"))

    @rule(op=commands, outcome=st.sampled_from(["succeeded", "failed"]))
    def resolve(self, op: uuid.UUID, outcome: str) -> None:
        was = self.state(op)
        try:
            self.run(resolutions.resolve_unknown(self.conn, self.tenant, op, outcome=outcome,  # type: ignore[arg-type]
                                              resolved_by="ops", reason="checked",
                                              receipt_check="unchecked", check_detail="a model of the ledger",
                                              receipt="r-op" if outcome == "succeeded" else None))
            assert was == "unknown"
        except errors.InvalidTransition:
            assert was != "unknown"

    # ---- invariants -----------------------------------------------------------------------

    def state(self, op: uuid.UUID) -> str:
        return str(self.row(op)["state"])

    def row(self, op: uuid.UUID) -> asyncpg.Record:
        return self.run(self.conn.fetchrow(
            "SELECT * FROM agent_command WHERE tenant_id = $1 AND operation_id = $2", self.tenant, op))

    @invariant()
    def ledger_holds(self) -> None:
        rows = self.run(self.conn.fetch(
            "SELECT c.operation_id, c.request_hash, c.state, c.provider_receipt, c.claim_token, "
            "c.lease_until, c.fencing_generation, "
            "(SELECT count(*) FROM command_outbox o WHERE o.tenant_id = c.tenant_id "
            " AND o.operation_id = c.operation_id) AS obligations "
            "FROM agent_command c WHERE c.tenant_id = $1", self.tenant))
        assert len(rows) == len(self.first_hash)  # one command per key, none lost
        for r in rows:
            op = r["operation_id"]
            assert bytes(r["request_hash"]) == self.first_hash[op]  # a conflict changes nothing
            assert r["obligations"] <= 1
            assert r["fencing_generation"] == self.generation.get(op, 0)
            if r["state"] == "succeeded":
                assert r["provider_receipt"]  # never a success without a receipt
            if r["state"] == "dispatching":
                assert r["claim_token"] is not None and r["lease_until"] is not None
            else:
                assert r["claim_token"] is None


def test_ledger_state_machine(database_url: str) -> None:
    LedgerMachine.url = database_url
    runner = LedgerMachine.TestCase
    runner.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                               suppress_health_check=[HealthCheck.too_slow])
    runner().runTest()


