"""`_meta` of a tool call (issue 40 item 6): reverse-DNS keys with the old names still read,
and a W3C `traceparent` that becomes the parent of the proposal's trace at ingress."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from agentledger import client, errors
from agentledger.mcp import calls, idempotency, runs

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("meta", [{"dev.agentledger/idempotency_key": "k-1"},
                                  {"agentledger/idempotency_key": "k-1"},
                                  {"dev.agentledger/idempotency_key": "k-1",
                                   "agentledger/idempotency_key": "k-1"}])
def test_the_key_is_read_under_the_reverse_dns_name_and_the_old_one(meta: dict[str, str]) -> None:
    assert idempotency.META_KEY == "dev.agentledger/idempotency_key"
    assert idempotency.key_for(meta, "user:alice", "crm.note.create", {}) == "k-1"


def test_two_names_that_disagree_are_refused() -> None:
    with pytest.raises(errors.ValidationFailed, match="differ"):
        idempotency.key_for({"dev.agentledger/idempotency_key": "a", "agentledger/idempotency_key": "b"},
                            "user:alice", "t", {})
    assert runs.run_for({"agentledger/run": "r-1"}, None) == "r-1"
    assert runs.run_for({runs.META_RUN: "r-2"}, "session") == "r-2"
    with pytest.raises(errors.ValidationFailed):
        runs.run_for({runs.META_RUN: "a", runs.LEGACY_META_RUN: "b"}, None)


def test_a_w3c_traceparent_is_kept_and_anything_else_ignored() -> None:
    assert calls.trace_of({"traceparent": TRACEPARENT, "tracestate": "k=v"}) == {
        "traceparent": TRACEPARENT, "tracestate": "k=v"}
    for bad in ({}, None, {"traceparent": "nope"}, {"traceparent": 7},
                {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}):
        assert calls.trace_of(bad) is None


async def test_the_gateway_client_sends_the_trace_to_ingress() -> None:
    seen: list[httpx.Request] = []
    op = uuid.uuid4()

    def ingress(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202, json={"operation_id": str(op), "tenant_id": str(uuid.uuid4()),
                                         "status": "accepted", "proposal_id": str(uuid.uuid4())})
    async with httpx.AsyncClient(transport=httpx.MockTransport(ingress), base_url="http://i") as http:
        gateway = client.GatewayClient(token="t", http=http)
        try:
            await gateway.submit_proposal("crm.note.create", {"body": "b"}, "c-1",
                                          idempotency_key="k", trace={"traceparent": TRACEPARENT,
                                                                      "authorization": "evil"})
        except errors.AgentLedgerError:
            pass  # what the stand-in answers is not the point: what was sent is
    assert seen and seen[0].headers["traceparent"] == TRACEPARENT
    assert seen[0].headers["authorization"] == "Bearer t"  # a trace cannot name another caller
    assert json.loads(seen[0].content)["action"] == "crm.note.create"


def test_the_run_opener_answers_a_fresh_handle_and_takes_no_arguments() -> None:
    from agentledger import identity
    one, two = runs.opened({}), runs.opened({})
    assert one.status == "run_opened" and not one.is_error and one.run != two.run
    assert one.run is not None and identity.is_run_name(one.run)
    assert one.structured() == {"status": "run_opened", "run": one.run}
    assert runs.opened({"name": "x"}).status == "refused"
