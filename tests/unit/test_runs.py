"""Runs (issue 21 item 6): the steps a gateway or an MCP session names as one run share its
budgets; the run id is derived per tenant and principal, and a bad run name publishes nothing.

In process: ingress' app with a recording broker, the gateway client over a mock transport,
the MCP server's run resolution. The budget itself is exercised in tests/e2e/test_runs.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import jwt
import pydantic
import pytest
from fastapi.testclient import TestClient

from agentledger import client as client_mod
from agentledger import errors, identity
from agentledger.mcp import runs
from agentledger.mcp.settings import McpSettings
from agentledger.services.ingress import app as app_mod
from agentledger.services.ingress import intake as intake_mod
from agentledger.services.ingress.settings import IngressSettings

IDP_PRIVATE, IDP_PUBLIC = identity.generate_keypair("EdDSA")
ENVELOPE_PRIVATE, ENVELOPE_PUBLIC = identity.generate_keypair("EdDSA")
ENVELOPE_KEYS = identity.KeySet.from_pem({"ingress-1": ENVELOPE_PUBLIC})
ISS, AUD = "https://idp.example", "agentledger-ingress"
TENANT, OTHER_TENANT = uuid.uuid4(), uuid.uuid4()
NOTE = {"action": "crm.note.create", "target": "c-1",
        "arguments": {"customer_id": "c-1", "body": "step"}}


def token(tenant: uuid.UUID = TENANT, principal: str = "user:alice") -> str:
    return identity.issue_session(IDP_PRIVATE, "idp-1", tenant_id=tenant, subject=principal,
                                  audience=AUD, issuer=ISS, roles=["user"])


# --- the derivation ----------------------------------------------------------------------


def test_the_run_id_is_fixed_per_tenant_principal_and_name() -> None:
    one = identity.derive_run_id(TENANT, "user:alice", "ticket-8812")
    assert one == identity.derive_run_id(TENANT, "user:alice", "ticket-8812")
    # Pinned: changing the derivation would open a fresh budget for a run's later steps.
    assert one == uuid.uuid5(identity.RUN_NAMESPACE, f"{TENANT}\x1fuser:alice\x1fticket-8812")
    others = {identity.derive_run_id(OTHER_TENANT, "user:alice", "ticket-8812"),
              identity.derive_run_id(TENANT, "user:bob", "ticket-8812"),
              identity.derive_run_id(TENANT, "user:alice", "ticket-8813"),
              # A name equal to an idempotency key never names that key's operation.
              identity.derive_operation_id(TENANT, "user:alice", "ticket-8812")}
    assert one not in others and len(others) == 4


@pytest.mark.parametrize("name", ["a", "ticket-8812", "run:2024.06~x_y", "A" * 128,
                                  str(uuid.uuid4())])
def test_run_names(name: str) -> None:
    assert identity.is_run_name(name)


@pytest.mark.parametrize("name", ["", "-leading-dash", "has space", "A" * 129, "é", "a/b",
                                  "a\nb", "a\x00"])
def test_bad_run_names_are_refused(name: str) -> None:
    assert not identity.is_run_name(name)
    with pytest.raises(errors.ValidationFailed, match="run name"):
        identity.derive_run_id(TENANT, "user:alice", name)


def test_envelopes_of_one_run_name_it_and_keep_their_own_token_ids() -> None:
    signer = identity.EnvelopeSigner(ENVELOPE_PRIVATE, "ingress-1")
    run_id = identity.derive_run_id(TENANT, "user:alice", "r")
    binding = identity.Binding("proposal", "0" * 64)
    tokens = [signer.sign(tenant_id=TENANT, principal_id="user:alice", operation_id=uuid.uuid4(),
                          request_id=run_id, binding=binding) for _ in range(2)]
    assert [identity.verify_envelope(t, ENVELOPE_KEYS).request_id for t in tokens] == [run_id] * 2
    jtis = {jwt.decode(t, options={"verify_signature": False})["jti"] for t in tokens}
    assert len(jtis) == 2 and str(run_id) not in jtis


# --- ingress -----------------------------------------------------------------------------


class RecordingBroker:
    """Stands in for the Kafka broker: what ingress would have published."""

    def __init__(self) -> None:
        self.published: list[tuple[str, dict[str, Any]]] = []

    async def publish(self, body: bytes, *, topic: str, key: bytes,
                      headers: dict[str, str]) -> None:
        self.published.append((topic, json.loads(body)))


@pytest.fixture
def ingress() -> tuple[TestClient, RecordingBroker]:
    cfg = IngressSettings.model_validate({
        "AGENTLEDGER_KAFKA_BOOTSTRAP": "127.0.0.1:9", "session_keys": {"idp-1": IDP_PUBLIC},
        "session_issuer": ISS, "session_audience": AUD, "envelope_key": ENVELOPE_PRIVATE})
    app = app_mod.create_app(cfg)
    broker = RecordingBroker()
    gate: intake_mod.Intake = app.state.intake
    # No lifespan (no Kafka): the routes publish to the recording broker instead.
    app.state.intake = intake_mod.Intake(
        broker=broker, session_keys=gate.session_keys,  # type: ignore[arg-type]
        session_issuer=ISS, session_audience=AUD, signer=gate.signer,
        requests_topic="requests", proposals_topic="proposals", publish_timeout_s=5)
    return TestClient(app), broker


def _post(http: TestClient, path: str, body: Any, bearer: str, **headers: str) -> httpx.Response:
    return http.post(path, json=body, headers={"Authorization": f"Bearer {bearer}", **headers})


def test_a_proposal_naming_a_run_binds_the_runs_id(ingress: tuple[TestClient, RecordingBroker]) -> None:
    http, broker = ingress
    answers = [_post(http, "/v1/proposals", {**NOTE, "arguments": {"customer_id": "c-1", "body": f"s{n}"}},
                     token(), **{"AgentLedger-Run": "triage-42", "Idempotency-Key": f"k{n}"})
               for n in range(2)]
    assert [a.status_code for a in answers] == [202, 202], [a.text for a in answers]
    run_id = identity.derive_run_id(TENANT, "user:alice", "triage-42")
    assert [a.json()["run_id"] for a in answers] == [str(run_id)] * 2
    envelopes = [identity.verify_envelope(p["identity"], ENVELOPE_KEYS) for _, p in broker.published]
    assert [e.request_id for e in envelopes] == [run_id, run_id]
    assert len({p["proposal_id"] for _, p in broker.published}) == 2


def test_the_same_run_name_of_another_tenant_or_principal_is_another_run(
        ingress: tuple[TestClient, RecordingBroker]) -> None:
    http, broker = ingress
    for bearer in (token(), token(OTHER_TENANT), token(principal="user:carol")):
        r = _post(http, "/v1/proposals", NOTE, bearer, **{"AgentLedger-Run": "shared-name"})
        assert r.status_code == 202, r.text
    found = [identity.verify_envelope(p["identity"], ENVELOPE_KEYS).request_id
             for _, p in broker.published]
    assert len(set(found)) == 3
    assert found == [identity.derive_run_id(TENANT, "user:alice", "shared-name"),
                     identity.derive_run_id(OTHER_TENANT, "user:alice", "shared-name"),
                     identity.derive_run_id(TENANT, "user:carol", "shared-name")]


def test_without_a_run_a_proposal_is_its_own_run(ingress: tuple[TestClient, RecordingBroker]) -> None:
    http, broker = ingress
    r = _post(http, "/v1/proposals", NOTE, token())
    assert r.status_code == 202 and r.json()["run_id"] is None
    [(_, proposal)] = broker.published
    assert str(identity.verify_envelope(proposal["identity"], ENVELOPE_KEYS).request_id) == (
        proposal["proposal_id"])


@pytest.mark.parametrize("bad", ["", "has space", "x" * 129, "-x", "a/b"])
def test_a_bad_run_name_is_422_and_nothing_is_published(
        ingress: tuple[TestClient, RecordingBroker], bad: str) -> None:
    http, broker = ingress
    r = _post(http, "/v1/proposals", NOTE, token(), **{"AgentLedger-Run": bad})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_request"
    assert "AgentLedger-Run" in r.json()["error"]["message"]
    assert broker.published == []


def test_a_request_to_plan_cannot_name_a_run(ingress: tuple[TestClient, RecordingBroker]) -> None:
    http, broker = ingress
    body = {"goal": "add note: hi", "resource": "c-1"}
    r = _post(http, "/v1/requests", body, token(), **{"AgentLedger-Run": "triage-42"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "validation_failed"
    assert "own run" in r.json()["error"]["message"]
    assert broker.published == []
    assert _post(http, "/v1/requests", body, token()).status_code == 202  # without: as before


def test_the_run_is_checked_after_the_token(ingress: tuple[TestClient, RecordingBroker]) -> None:
    http, broker = ingress
    r = http.post("/v1/proposals", json=NOTE, headers={"AgentLedger-Run": "ok"})
    assert r.status_code == 401 and broker.published == []


# --- the gateway client ------------------------------------------------------------------


async def test_the_client_sends_the_run_and_returns_its_id() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        run = request.headers.get("agentledger-run")
        return httpx.Response(202, json={
            "operation_id": str(uuid.uuid4()), "tenant_id": str(TENANT),
            "proposal_id": str(uuid.uuid4()),
            "run_id": str(identity.derive_run_id(TENANT, "user:alice", run)) if run else None})

    bearer = token()
    http = httpx.AsyncClient(base_url="http://ingress.test", transport=httpx.MockTransport(answer))
    gw = client_mod.GatewayClient(token=bearer, http=http)
    try:
        sub = await gw.submit_proposal("crm.note.create", {"customer_id": "c-1", "body": "b"}, "c-1",
                                       run="r-1")
        plain = await gw.submit_proposal("crm.note.create", {"customer_id": "c-1", "body": "b"}, "c-1")
        with pytest.raises(errors.ValidationFailed, match="run must be"):
            await gw.submit_proposal("crm.note.create", {"customer_id": "c-1", "body": "b"}, "c-1",
                                     run="not a run")
    finally:
        await gw.aclose()
    assert [r.headers.get("agentledger-run") for r in seen] == ["r-1", None]  # the bad one: unsent
    assert sub.run_id == client_mod.run_id_for(bearer, "r-1") == identity.derive_run_id(
        TENANT, "user:alice", "r-1")
    assert plain.run_id is None


# --- the MCP server ----------------------------------------------------------------------


class Headers:
    def __init__(self, **headers: str) -> None:
        self.headers = httpx.Headers(headers)


def test_mcp_meta_names_the_run_first_then_the_session() -> None:
    assert runs.run_for({runs.META_RUN: "call-run"}, "session-run") == "call-run"
    assert runs.run_for({"agentledger/idempotency_key": "k"}, "session-run") == "session-run"
    assert runs.run_for(None, None) is None


@pytest.mark.parametrize(("meta", "session", "where"), [
    ({runs.META_RUN: "has space"}, None, "_meta"),
    ({runs.META_RUN: 5}, "fine", "_meta"),
    ({runs.META_RUN: ""}, "fine", "_meta"),
    (None, "x" * 129, "session"),
])
def test_mcp_a_bad_run_is_refused(meta: dict[str, Any] | None, session: str | None,
                                  where: str) -> None:
    with pytest.raises(errors.ValidationFailed, match=where):
        runs.run_for(meta, session)


def test_mcp_the_session_run_is_the_http_header_or_the_stdio_setting() -> None:
    assert runs.session_run(Headers(**{"AgentLedger-Run": "from-header"}), "configured") == "from-header"
    # Over HTTP the configured run (stdio's) never applies: each client names its own.
    assert runs.session_run(Headers(), "configured") is None
    assert runs.session_run(None, "configured") == "configured"


def test_mcp_the_configured_run_is_validated() -> None:
    base = {"AGENTLEDGER_KAFKA_BOOTSTRAP": "k:1", "AGENTLEDGER_DATABASE_URL": "postgresql://x/y",
            "session_keys": {"idp-1": IDP_PUBLIC}, "session_issuer": ISS}
    assert McpSettings.model_validate({**base, "run": "agent-7"}).run == "agent-7"
    with pytest.raises(pydantic.ValidationError):
        McpSettings.model_validate({**base, "run": "not a run"})
