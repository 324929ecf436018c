"""Ingress end to end: real Kafka, a real CRM, ingress and the rules planner as subprocesses.

Assertions are on what is (and is not) on the topics, never only on status codes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import jwt
import psycopg2
import pytest
from confluent_kafka import Producer
from cryptography.hazmat.primitives import hashes, hmac, serialization

from agentledger import client as client_mod
from agentledger import identity, logins
from agentledger.contracts import admission, outcomes, topics
from agentledger.services.ingress import intake as intake_mod
from agentledger.testing import kafka_read, processes
from agentledger.testing.polling import wait_until
from tests.stack import Stack

ADMIN_TOKEN = "crm-admin-" + uuid.uuid4().hex
ISSUER, AUDIENCE = "https://idp.test", "agentledger-ingress"


def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record of a topic up to its current end (high watermark), all partitions."""
    return list(kafka_read.read_to_end(bootstrap, [topic]))


def find(bootstrap: str, topic: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60) -> Any:
    """The first record whose JSON value satisfies ``predicate``, polled to a deadline."""
    found: list[Any] = []

    def probe() -> bool:
        found.extend(m for m in read_all(bootstrap, topic) if predicate(json.loads(m.value())))
        return bool(found)
    assert wait_until(probe, timeout=timeout, interval=0.5), f"no matching record on {topic}"
    return found[0]


class World:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def token(self, tenant: str | None = None, **overrides: Any) -> str:
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "user:alice", "tenant_id": tenant or self.tenant_a,
                  "roles": ["agent"], "iat": int(time.time()), "exp": int(time.time()) + 600, **overrides}
        key = serialization.load_pem_private_key(self.idp_private.encode(), password=None)
        return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": "idp-1"})  # type: ignore[arg-type]

    def post(self, path: str, body: Any, token: str | None = None, **headers: str) -> httpx.Response:
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(f"{self.url}{path}", json=body, headers={**auth, **headers}, timeout=30)


@pytest.fixture(scope="module")
def world(stack: Stack, make_database: Callable[[], str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    logs = tmp_path_factory.mktemp("logs")
    crm_port, port = processes.free_port(), processes.free_port()
    crm_url, url = f"http://127.0.0.1:{crm_port}", f"http://127.0.0.1:{port}"
    crm_env = {"AGENTLEDGER_CRM_DATABASE_URL": make_database(), "AGENTLEDGER_CRM_PORT": str(crm_port),
               "AGENTLEDGER_CRM_ADMIN_TOKEN": ADMIN_TOKEN}
    idp_private, idp_public = identity.generate_keypair("EdDSA")
    envelope_private, envelope_public = identity.generate_keypair("EdDSA")
    with processes.running("agentledger.services.crm", crm_env, logs / "crm.log",
                           ready=processes.http_ok(f"{crm_url}/readyz")):
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        tenant_a, tenant_b = str(uuid.uuid4()), str(uuid.uuid4())
        read_tokens: dict[str, str] = {}
        for tenant, customer in ((tenant_a, "cust-a"), (tenant_b, "cust-b")):
            r = httpx.put(f"{crm_url}/admin/tenants/{tenant}/customers/{customer}", headers=admin,
                          json={"display_name": "Ada Lovelace", "email": "ada@old.example"})
            assert r.status_code == 200, r.text
            r = httpx.post(f"{crm_url}/admin/tenants/{tenant}/tokens", headers=admin, json={"scopes": ["read"]})
            assert r.status_code == 201, r.text
            read_tokens[tenant] = r.json()["token"]
        suffix = uuid.uuid4().hex[:8]
        # Ingress' own login to a ledger: one function, the request hash an operation holds.
        ledger_url = make_database()
        ingress_login = asyncio.run(logins.ensure(ledger_url, ("ingress",)))["ingress"]
        names = {"requests": f"agent.requests.t{suffix}.v1", "proposals": f"agent.proposals.t{suffix}.v1",
                 "gateway": f"gateway.proposals.t{suffix}.v1"}
        ingress_env = {
            "AGENTLEDGER_KAFKA_BOOTSTRAP": stack.kafka_bootstrap, "AGENTLEDGER_INGRESS_PORT": str(port),
            "AGENTLEDGER_INGRESS_SESSION_KEYS": json.dumps({"idp-1": idp_public}),
            "AGENTLEDGER_INGRESS_SESSION_ISSUER": ISSUER, "AGENTLEDGER_INGRESS_SESSION_AUDIENCE": AUDIENCE,
            "AGENTLEDGER_INGRESS_ENVELOPE_KEY": envelope_private,
            "AGENTLEDGER_INGRESS_REQUESTS_TOPIC": names["requests"],
            "AGENTLEDGER_INGRESS_PROPOSALS_TOPIC": names["proposals"],
            "AGENTLEDGER_INGRESS_GATEWAY_PROPOSALS_TOPIC": names["gateway"],
            "AGENTLEDGER_INGRESS_GROUP_ID": f"ingress-{suffix}", "AGENTLEDGER_INGRESS_PARTITIONS": "3",
            "AGENTLEDGER_DATABASE_URL": ingress_login,
        }
        planner_env = {
            "AGENTLEDGER_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
            "AGENTLEDGER_PLANNER_ENVELOPE_KEYS": json.dumps({"ingress-1": envelope_public}),
            "AGENTLEDGER_PLANNER_CRM_URL": crm_url,
            "AGENTLEDGER_PLANNER_CRM_READ_TOKENS": json.dumps(read_tokens),
            "AGENTLEDGER_PLANNER_REQUESTS_TOPIC": names["requests"],
            "AGENTLEDGER_PLANNER_PROPOSALS_TOPIC": names["proposals"],
            "AGENTLEDGER_PLANNER_GROUP_ID": f"planner-{suffix}", "AGENTLEDGER_PLANNER_PARTITIONS": "3",
        }
        with processes.running("agentledger.services.ingress", ingress_env, logs / "ingress.log",
                               ready=processes.http_ok(f"{url}/readyz"), timeout=90), \
             processes.running("agentledger.services.planner", planner_env, logs / "planner.log",
                               ready=processes.group_has_members(stack.kafka_bootstrap, f"planner-{suffix}"),
                               timeout=90):
            assert wait_until(processes.group_has_members(stack.kafka_bootstrap, f"ingress-{suffix}"), timeout=60)
            yield World(stack=stack, url=url, crm_url=crm_url, tenant_a=tenant_a, tenant_b=tenant_b,
                        ledger_url=ledger_url,
                        read_tokens=read_tokens, idp_private=idp_private,
                        envelope_keys=identity.KeySet.from_pem({"ingress-1": envelope_public}), **names)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def bad_tokens(world: World) -> dict[str, str | None]:
    other_private, _ = identity.generate_keypair("EdDSA")
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "user:mallory", "tenant_id": world.tenant_b,
              "exp": int(time.time()) + 600}
    header_none = b64(json.dumps({"alg": "none", "kid": "idp-1"}).encode())
    body = b64(json.dumps(claims).encode())
    hs_header = b64(json.dumps({"alg": "HS256", "kid": "idp-1"}).encode())
    public_pem = serialization.load_pem_private_key(world.idp_private.encode(), password=None).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    mac = hmac.HMAC(public_pem, hashes.SHA256())
    mac.update(f"{hs_header}.{body}".encode())
    return {
        "missing": None,
        "forged": jwt.encode(claims, serialization.load_pem_private_key(other_private.encode(), password=None),  # type: ignore[arg-type]
                             algorithm="EdDSA", headers={"kid": "idp-1"}),
        "expired": world.token(exp=int(time.time()) - 3600),
        "wrong audience": world.token(aud="another-service"),
        "wrong issuer": world.token(iss="https://evil.test"),
        "alg none": f"{header_none}.{body}.",
        "HS256 with the public key": f"{hs_header}.{body}.{b64(mac.finalize())}",
    }


def test_bad_tokens_are_401_and_nothing_is_produced(world: World) -> None:
    marker = "MARKER-" + uuid.uuid4().hex
    for case, token in bad_tokens(world).items():
        for path, body in (("/v1/requests", {"goal": f"add note: {marker}", "resource": "cust-b"}),
                           ("/v1/proposals", {"action": "crm.note.create", "target": "cust-b",
                                              "arguments": {"customer_id": "cust-b", "body": marker}})):
            r = world.post(path, body, token, **{"Idempotency-Key": f"k-{case.replace(' ', '-')}"})
            assert r.status_code == 401, (case, path, r.text)
            assert r.json()["error"]["code"] == "identity_rejected"
            assert r.headers["www-authenticate"] == "Bearer"
    # A good request afterwards proves ingress publishes; the topics hold nothing else of ours.
    ok = world.post("/v1/requests", {"goal": "add note: sentinel", "resource": "cust-a"}, world.token())
    assert ok.status_code == 202, ok.text
    for topic in (world.requests, world.proposals):
        values = [m.value() for m in read_all(world.stack.kafka_bootstrap, topic)]
        assert not [v for v in values if marker.encode() in v], topic
    assert any(b"sentinel" in v for v in (m.value() for m in read_all(world.stack.kafka_bootstrap, world.requests)))


def test_retry_with_the_same_idempotency_key_keeps_the_operation_id(world: World) -> None:
    body = {"goal": "add note: retried", "resource": "cust-a"}
    first = world.post("/v1/requests", body, world.token(), **{"Idempotency-Key": "order-42"})
    again = world.post("/v1/requests", body, world.token(), **{"Idempotency-Key": "order-42"})
    other = world.post("/v1/requests", body, world.token(), **{"Idempotency-Key": "order-43"})
    keyless = [world.post("/v1/requests", body, world.token()) for _ in range(2)]
    for r in (first, again, other, *keyless):
        assert r.status_code == 202, r.text
    assert first.json()["operation_id"] == again.json()["operation_id"]
    assert first.json()["request_id"] != again.json()["request_id"]
    assert other.json()["operation_id"] != first.json()["operation_id"]
    assert keyless[0].json()["operation_id"] != keyless[1].json()["operation_id"]
    assert first.json()["operation_id"] == str(identity.derive_operation_id(
        uuid.UUID(world.tenant_a), "user:alice", "order-42"))
    # Both copies are on the topic, each with that operation id and its own envelope.
    records = [json.loads(m.value()) for m in read_all(world.stack.kafka_bootstrap, world.requests)]
    copies = [r for r in records if r["operation_id"] == first.json()["operation_id"]]
    assert len(copies) == 2 and len({c["request_id"] for c in copies}) == 2


def test_request_flows_through_the_planner_with_evidence_and_envelope(world: World) -> None:
    traceparent = f"00-{'a1' * 16}-{'b2' * 8}-01"
    r = world.post("/v1/requests", {"goal": "update email to ada@new.example", "resource": "cust-a"},
                   world.token(), traceparent=traceparent, **{"Idempotency-Key": "email-change-1"})
    assert r.status_code == 202, r.text
    accepted = r.json()
    msg = find(world.stack.kafka_bootstrap, world.proposals,
               lambda p: p["operation_id"] == accepted["operation_id"])
    proposal = json.loads(msg.value())
    assert msg.key() == world.tenant_a.encode()
    headers = dict(msg.headers())
    assert headers["traceparent"].decode().split("-")[1] == "a1" * 16  # the gateway's trace continues
    assert (proposal["tenant_id"], proposal["principal_id"]) == (world.tenant_a, "user:alice")
    assert (proposal["action"], proposal["target"], proposal["expected_revision"]) == (
        "crm.contact.update", "cust-a", "1")
    assert proposal["arguments"] == {"customer_id": "cust-a", "changes": {"email": "ada@new.example"}}
    who = identity.verify_envelope(proposal["identity"], world.envelope_keys)
    assert (str(who.tenant_id), who.principal_id, str(who.operation_id), str(who.request_id)) == (
        world.tenant_a, "user:alice", accepted["operation_id"], accepted["request_id"])
    # The evidence is a snapshot of what the CRM served, hashed over the full body.
    served = httpx.get(f"{world.crm_url}/v1/customers/cust-a",
                       headers={"Authorization": f"Bearer {world.read_tokens[world.tenant_a]}"})
    [evidence] = proposal["evidence"]
    assert (evidence["ref"], evidence["source"]) == ("E1", "crm:customers/cust-a")
    assert evidence["sha256"] == hashlib.sha256(served.content).hexdigest()
    assert "Ada Lovelace" in evidence["excerpt"] and evidence["fetched_at"]
    assert proposal["evidence_refs"] == [f"crm:customers/cust-a#sha256:{evidence['sha256'][:16]}"]
    assert proposal["planner"] == {"name": "rules", "model": None}


def test_gateway_proposal_over_http_carries_the_envelope(world: World) -> None:
    body = {"action": "crm.note.create", "target": "cust-a", "arguments": {"customer_id": "cust-a", "body": "hi"}}
    r = world.post("/v1/proposals", body, world.token(roles=["agent", "support"]), **{"Idempotency-Key": "p-1"})
    assert r.status_code == 202, r.text
    msg = find(world.stack.kafka_bootstrap, world.proposals, lambda p: p["proposal_id"] == r.json()["proposal_id"])
    proposal = json.loads(msg.value())
    who = identity.verify_envelope(proposal["identity"], world.envelope_keys)
    assert (str(who.operation_id), who.roles) == (r.json()["operation_id"], ("agent", "support"))
    assert proposal["planner"]["name"] == "gateway" and proposal["tenant_id"] == world.tenant_a


def test_kafka_entry_accepts_valid_tokens_and_dead_letters_bad_ones(world: World) -> None:
    producer = Producer({"bootstrap.servers": world.stack.kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    marker = "KAFKA-" + uuid.uuid4().hex
    body = json.dumps({"action": "crm.note.create", "target": "cust-a",
                       "arguments": {"customer_id": "cust-a", "body": marker}}).encode()
    bad = bad_tokens(world)["forged"]
    producer.produce(world.gateway, value=body, key=b"k", headers=[("authorization", f"Bearer {bad}".encode())])
    producer.produce(world.gateway, value=b"{not json", key=b"k",
                     headers=[("authorization", f"Bearer {world.token()}".encode())])
    producer.produce(world.gateway, value=body, key=b"k",
                     headers=[("authorization", f"Bearer {world.token()}".encode()), ("idempotency-key", b"kafka-1")])
    assert producer.flush(15) == 0
    expected = str(identity.derive_operation_id(uuid.UUID(world.tenant_a), "user:alice", "kafka-1"))
    msg = find(world.stack.kafka_bootstrap, world.proposals, lambda p: p["operation_id"] == expected)
    assert json.loads(msg.value())["arguments"]["body"] == marker
    dlq = topics.dlq_topic(world.gateway)
    find(world.stack.kafka_bootstrap, dlq, lambda d: d["error_code"] == "identity_rejected")
    find(world.stack.kafka_bootstrap, dlq, lambda d: d["error_code"] == "poison_message")
    # Only the valid one was published, once; no token was copied into the dead letters.
    published = [m for m in read_all(world.stack.kafka_bootstrap, world.proposals) if marker.encode() in m.value()]
    assert len(published) == 1
    assert not [m for m in read_all(world.stack.kafka_bootstrap, dlq) if b"Bearer" in m.value()
                or any(b"Bearer" in (v or b"") for _, v in (m.headers() or []))]


def test_a_named_run_binds_the_envelope_over_http_and_kafka_and_a_bad_one_publishes_nothing(world: World) -> None:
    # Issue 21 item 6: the steps of a run name it (AgentLedger-Run); their envelopes bind the
    # run id, the budgets' workflow id. A bad name is refused (422 / DLQ), nothing published.
    run, marker = f"run-{uuid.uuid4().hex[:8]}", "RUN-" + uuid.uuid4().hex
    run_id = identity.derive_run_id(uuid.UUID(world.tenant_a), "user:alice", run)
    note = {"action": "crm.note.create", "target": "cust-a", "arguments": {"customer_id": "cust-a", "body": marker}}
    over_http = world.post("/v1/proposals", note, world.token(), **{"AgentLedger-Run": run})
    assert over_http.status_code == 202 and over_http.json()["run_id"] == str(run_id), over_http.text
    bad = world.post("/v1/proposals", note, world.token(), **{"AgentLedger-Run": "no spaces"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request", bad.text
    as_request = world.post("/v1/requests", {"goal": f"add note: {marker}", "resource": "cust-a"}, world.token(),
                            **{"AgentLedger-Run": run})
    assert as_request.status_code == 400 and as_request.json()["error"]["code"] == "validation_failed"
    producer = Producer({"bootstrap.servers": world.stack.kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    auth = ("authorization", f"Bearer {world.token()}".encode())
    producer.produce(world.gateway, value=json.dumps(note).encode(), key=b"k",
                     headers=[auth, ("idempotency-key", f"{run}-kafka".encode()), ("agentledger-run", run.encode())])
    producer.produce(world.gateway, value=json.dumps(note).encode(), key=b"k",
                     headers=[auth, ("idempotency-key", f"{run}-bad".encode()), ("agentledger-run", b"a/b")])
    assert producer.flush(15) == 0
    over_kafka = str(identity.derive_operation_id(uuid.UUID(world.tenant_a), "user:alice", f"{run}-kafka"))
    find(world.stack.kafka_bootstrap, world.proposals, lambda p: p["operation_id"] == over_kafka)
    find(world.stack.kafka_bootstrap, topics.dlq_topic(world.gateway),
         lambda d: d["error_code"] == "poison_message" and "agentledger-run" in d["reason"])
    published = [json.loads(m.value()) for m in read_all(world.stack.kafka_bootstrap, world.proposals)
                 if marker.encode() in m.value()]
    assert sorted(p["operation_id"] for p in published) == sorted([over_http.json()["operation_id"], over_kafka])
    assert {identity.verify_envelope(p["identity"], world.envelope_keys).request_id for p in published} == {run_id}
    requests = [m for m in read_all(world.stack.kafka_bootstrap, world.requests) if marker.encode() in m.value()]
    assert requests == []


def test_limits_and_errors_are_clear_json(world: World) -> None:
    token = world.token()
    big = world.post("/v1/requests", {"goal": "x" * 70_000, "resource": "cust-a"}, token)
    assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
    long_goal = world.post("/v1/requests", {"goal": "x" * 2001, "resource": "cust-a"}, token)
    assert long_goal.status_code == 422 and "goal" in long_goal.json()["error"]["message"]
    extra = world.post("/v1/requests", {"goal": "g", "resource": "cust-a", "tenant_id": world.tenant_b}, token)
    assert extra.status_code == 422 and extra.json()["error"]["code"] == "invalid_request"
    bad_key = world.post("/v1/requests", {"goal": "g", "resource": "cust-a"}, token, **{"Idempotency-Key": "a b"})
    assert bad_key.status_code == 422
    schema = httpx.get(f"{world.url}/openapi.json").json()
    assert {"/v1/requests", "/v1/proposals"} <= set(schema["paths"])
    assert httpx.get(f"{world.url}/healthz").status_code == 200
    assert httpx.get(f"{world.url}/readyz").json() == {"status": "ready"}


async def test_client_retries_keep_the_operation_and_await_reads_the_answers(
    world: World, new_topic: Callable[..., str]
) -> None:
    admissions, outcome_topic = new_topic("admissions"), new_topic("outcomes")
    client = client_mod.GatewayClient(token=world.token(), ingress_url=world.url,
                                      kafka_bootstrap=world.stack.kafka_bootstrap, gateway_topic=world.gateway,
                                      admissions_topic=admissions, outcomes_topic=outcome_topic)
    try:
        first = await client.submit_request("add note: via client", "cust-a", idempotency_key="client-1")
        again = await client.submit_request("add note: via client", "cust-a", idempotency_key="client-1")
        assert first.operation_id == again.operation_id
        generated = await client.submit_request("add note: via client", "cust-a")
        assert generated.idempotency_key and generated.operation_id != first.operation_id
        sent = await client.publish_proposal("crm.note.create", {"customer_id": "cust-a", "body": "k"}, "cust-a",
                                             idempotency_key="client-kafka-1")
        find(world.stack.kafka_bootstrap, world.proposals, lambda p: p["operation_id"] == str(sent.operation_id))

        # Stand in for admission and the relay: publish an answer and an outcome.
        now = datetime.now(UTC)
        producer = Producer({"bootstrap.servers": world.stack.kafka_bootstrap})
        answer = admission.AdmissionResultV1(tenant_id=uuid.UUID(world.tenant_a), operation_id=first.operation_id,
                                             status="admitted", state="pending", decided_at=now)
        done = outcomes.OutcomeEventV1(tenant_id=uuid.UUID(world.tenant_a), operation_id=first.operation_id,
                                       outcome=outcomes.Succeeded(receipt="note-1"), recorded_at=now)
        refused = admission.AdmissionResultV1(operation_id=sent.operation_id, status="rejected",
                                              reason_code="policy_denied", reason="no", decided_at=now)
        for topic, message in ((admissions, answer), (outcome_topic, done), (admissions, refused)):
            producer.produce(topic, value=message.model_dump_json().encode(), key=world.tenant_a.encode())
        assert producer.flush(15) == 0
        resolved = await client.await_outcome(first.operation_id, timeout_s=30)
        assert resolved.outcome == outcomes.Succeeded(receipt="note-1")
        admitted = await client.await_outcome(first.operation_id, timeout_s=30, until="admission", since=now)
        assert admitted.admission is not None and admitted.admission.status == "admitted"
        rejected = await client.await_outcome(sent.operation_id, timeout_s=30)
        assert rejected.refused and rejected.outcome is None
        with pytest.raises(TimeoutError):
            await client.await_outcome(uuid.uuid4(), timeout_s=2)
    finally:
        await client.aclose()


_COMMAND = """
INSERT INTO agent_command (tenant_id, operation_id, request_hash, state, principal_id, action,
  connector, resource_id, decision_id, policy_version, allowlist_version, expires_at,
  payload_ciphertext, payload_key_version)
VALUES (%s, %s, %s, 'pending', 'user:alice', 'crm.note.create', 'crm', 'cust-a', %s, 'p1',
  'a1', now() + interval '1 hour', %s, 1)
"""


def test_a_changed_resubmission_of_an_admitted_key_is_409_and_publishes_nothing(world: World) -> None:
    # Issue 18 §2: ingress said 202 and admission later said `conflict`, though the ledger
    # already held the key's command with other content. Now: 409 at once, nothing published.
    key, tenant = f"conflict-{uuid.uuid4().hex[:8]}", uuid.UUID(world.tenant_a)
    op = identity.derive_operation_id(tenant, "user:alice", key)
    first = {"action": "crm.note.create", "target": "cust-a",
             "arguments": {"customer_id": "cust-a", "body": "the original"}}
    digest = identity.proposal_binding(
        tenant_id=tenant, principal_id="user:alice", action=first["action"], target="cust-a",
        arguments=first["arguments"], expected_revision=None).digest
    conn = psycopg2.connect(world.ledger_url)
    try:
        with conn, conn.cursor() as cur:  # the first submission, admitted
            cur.execute(_COMMAND, (str(tenant), str(op), bytes.fromhex(digest), str(uuid.uuid4()),
                                   b"\x00" * 16))
    finally:
        conn.close()
    token = world.token()
    changed = {**first, "arguments": {"customer_id": "cust-a", "body": "changed"}}
    r = world.post("/v1/proposals", changed, token, **{"Idempotency-Key": key})
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "idempotency_conflict"
    same = world.post("/v1/proposals", first, token, **{"Idempotency-Key": key})
    assert same.status_code == 202, same.text  # the same content: admission answers a replay
    assert same.json()["operation_id"] == str(op)
    other = world.post("/v1/proposals", changed, token, **{"Idempotency-Key": key + "-new"})
    assert other.status_code == 202, other.text  # new content under a new key is new work
    # Positive marker first (the later proposal is on the topic), then the absence.
    find(world.stack.kafka_bootstrap, world.proposals,
         lambda p: p["proposal_id"] == other.json()["proposal_id"])
    published = [json.loads(m.value()) for m in read_all(world.stack.kafka_bootstrap, world.proposals)]
    mine = [p for p in published if p["operation_id"] == str(op)]
    assert [p["arguments"]["body"] for p in mine] == ["the original"], mine


async def test_the_conflict_check_fails_open_when_the_ledger_does_not_answer() -> None:
    # Admission stays the authority: a ledger that is away costs the early 409, never a request.
    check = intake_mod.ConflictCheck(f"postgresql://x:y@127.0.0.1:{processes.free_port()}/none", 0.5)
    await check.start()
    try:
        assert await check.held(uuid.uuid4(), uuid.uuid4()) is None
    finally:
        await check.close()
