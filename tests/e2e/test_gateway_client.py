"""The gateway client's answers are the answers to ITS submission (issue 18 §2).

`await_outcome` matched records by operation id only, and returned the first it saw: after a
resubmission with a changed payload under the same idempotency key, it returned the
original's `admitted` (3 of 3 runs, `until="admission"`) or `succeeded` (1 of 3) instead of
the conflict. Real services: ingress, admission, relay, executor, over Kafka and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from agentledger import client as client_mod
from agentledger import errors
from agentledger.contracts import outcomes
from agentledger.testing.pipeline import Pipeline, pipeline
from tests.stack import Stack

RUNS = 20


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("client"), ingress=True) as p:
        yield p


def _client(p: Pipeline) -> client_mod.GatewayClient:
    assert p.sessions is not None and p.ingress_url
    return client_mod.GatewayClient(
        token=p.sessions.issue(p.tenant, "user:alice", ["user"]), ingress_url=p.ingress_url,
        kafka_bootstrap=p.bootstrap, gateway_topic=p.topic("gateway.proposals.v1"),
        admissions_topic=p.topic("agent.admissions.v1"), outcomes_topic=p.topic("agent.outcomes.v1"))


def test_a_changed_resubmission_is_told_its_conflict_never_the_originals_answer(world: Pipeline) -> None:
    async def runs() -> list[tuple[str, str, str]]:
        gw = _client(world)
        seen = []
        try:
            for i in range(RUNS):
                key, since = f"client-conflict-{uuid.uuid4().hex}", datetime.now(UTC)
                first = await gw.submit_proposal("crm.note.create", {"customer_id": world.customer,
                                                                      "body": f"first {i}"},
                                                 world.customer, idempotency_key=key)
                done = await gw.await_outcome(first, since=since, timeout_s=60)
                assert isinstance(done.outcome, outcomes.Succeeded), done
                body = {"customer_id": world.customer, "body": f"changed {i}"}
                if i % 2 == 0:
                    # Over HTTP the conflict is knowable at once: ingress says 409 and
                    # publishes nothing (issue 18 §2).
                    with pytest.raises(errors.IdempotencyConflict):
                        await gw.submit_proposal("crm.note.create", body, world.customer,
                                                 idempotency_key=key)
                    seen.append(("409", "409", "NoneType"))
                    continue
                # Over Kafka admission answers; matched on the record's proposal id.
                changed = await gw.publish_proposal("crm.note.create", body, world.customer,
                                                    idempotency_key=key)
                assert changed.operation_id == first.operation_id and changed.proposal_id != first.proposal_id
                at_admission = await gw.await_outcome(changed, since=since, until="admission", timeout_s=60)
                at_outcome = await gw.await_outcome(changed, since=since, timeout_s=60)
                assert at_admission.admission is not None and at_outcome.admission is not None
                seen.append((at_admission.admission.status, at_outcome.admission.status,
                             type(at_outcome.outcome).__name__))
        finally:
            await gw.aclose()
        return seen
    seen = asyncio.run(runs())
    assert seen == [("409", "409", "NoneType") if i % 2 == 0 else ("conflict", "conflict", "NoneType")
                    for i in range(RUNS)], seen
