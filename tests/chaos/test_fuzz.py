"""≥ 10,000 malformed or hostile proposals through ingress and the proposal topic:
0 admitted, 0 5xx, 0 crashed consumers, every Kafka poison message in the DLQ."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg2
import pydantic
import pytest
from confluent_kafka import Consumer, Producer

from agentledger.contracts.proposals import ProposalV1
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.chaos.fuzzing import Fuzzer
from tests.stack import Stack

SEED = int(os.environ.get("AGENTLEDGER_FUZZ_SEED", "20261202"))
KAFKA_N = int(os.environ.get("AGENTLEDGER_FUZZ_KAFKA", "6000"))
HTTP_N = int(os.environ.get("AGENTLEDGER_FUZZ_HTTP", "4000"))


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("fuzz"), console=True, ingress=True) as p:
        yield p


def _admitted(p: Pipeline) -> int:
    conn = psycopg2.connect(p.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM agent_command")
            (n,) = cur.fetchone() or (0,)
            cur.execute("SELECT count(*) FROM approval_request")
            (m,) = cur.fetchone() or (0,)
    finally:
        conn.close()
    return int(n) + int(m)


@pytest.mark.timeout(900)
def test_ten_thousand_hostile_proposals_admit_nothing(world: Pipeline) -> None:
    other_tenant, other_customer = next(iter(world.others.items()))
    fuzz = Fuzzer(SEED, world.tenant, world.customer, other_tenant, other_customer)
    before = _admitted(world)

    # --- through the proposal topic -------------------------------------------------------
    producer = Producer({"bootstrap.servers": world.bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5})
    poison: set[str] = set()      # keys whose value cannot parse: must reach the DLQ
    parseable: set[str] = set()   # proposal ids that parse: must get a rejection
    defects: dict[str, int] = {}
    via_kafka: dict[str, str] = {}
    for i in range(KAFKA_N):
        value, defect = fuzz.kafka_message()
        defects[defect] = defects.get(defect, 0) + 1
        key = f"fuzz-{SEED}-{i}"
        try:
            pid = str(ProposalV1.model_validate_json(value).proposal_id)
            parseable.add(pid)
            via_kafka[pid] = defect
        except (pydantic.ValidationError, ValueError):
            poison.add(key)
        producer.produce(world.topic("agent.proposals.v1"), key=key.encode(), value=value)
        if i % 1000 == 999:
            producer.flush(30)
    assert producer.flush(60) == 0

    # --- through ingress -------------------------------------------------------------------
    assert world.sessions is not None and world.ingress_url
    token = world.sessions.issue(world.tenant, "user:alice", ["user"])
    statuses: dict[int, int] = {}
    via_http: dict[str, str] = {}

    async def post_all() -> None:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(base_url=world.ingress_url, timeout=30, limits=limits) as client:
            sem = asyncio.Semaphore(16)

            async def one(i: int) -> None:
                body, defect = fuzz.http_body()
                headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                if i % 50 == 0:  # a share of hostile credentials too
                    headers["Authorization"] = "Bearer " + token[:-4] + "AAAA"
                async with sem:
                    r = await client.post("/v1/proposals", content=body, headers=headers)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code == 202:
                    parseable.add(str(r.json()["proposal_id"]))
                    via_http[str(r.json()["proposal_id"])] = defect
            await asyncio.gather(*(one(i) for i in range(HTTP_N)))

    asyncio.run(post_all())
    assert not [s for s in statuses if s >= 500], statuses
    assert set(statuses) <= {202, 400, 401, 413, 415, 422}, statuses

    # --- every message answered: poison in the DLQ, the rest rejected ----------------------
    dead: set[str] = set()
    answers: dict[str, dict[str, Any]] = {}
    consumer = Consumer({"bootstrap.servers": world.bootstrap, "group.id": f"fuzz-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([world.topic("agent.proposals.dlq.v1"), world.topic("agent.admissions.v1")])

    def drain() -> bool:
        for msg in consumer.consume(500, timeout=0.5):
            if msg.error() is not None:
                continue
            if msg.topic().endswith("dlq.v1"):
                dead.add((msg.key() or b"").decode(errors="replace"))
            else:
                body = json.loads(msg.value())
                answers[str(body.get("proposal_id"))] = body
        return poison <= dead and parseable <= set(answers)
    try:
        assert wait_until(drain, timeout=600, interval=0), (
            f"missing DLQ {len(poison - dead)}, missing answers {len(parseable - set(answers))}")
    finally:
        consumer.close()
    ours = [answers[p] for p in parseable]
    wrong = [a for a in ours if a["status"] != "rejected"]
    assert wrong == [], {a["proposal_id"]: via_http.get(a["proposal_id"]) or via_kafka.get(a["proposal_id"]) for a in wrong[:20]}
    assert _admitted(world) == before  # nothing admitted, nothing waiting for approval
    for name in ("admission", "ingress", "relay", "executor-crm"):
        assert world.services[name].alive(), f"{name} crashed\n{world.services[name].tail()}"
    print(f"fuzz seed={SEED} kafka={KAFKA_N} (poison {len(poison)}) http={HTTP_N} "
          f"statuses={statuses} defects={defects}")
