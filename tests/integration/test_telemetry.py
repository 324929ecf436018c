"""Spans, links and bounded metrics of the library, on the real ledger and CRM (R8.1-R8.3).

The SDK is installed in this process with in-memory exporters (once: OpenTelemetry's global
providers cannot be replaced), and the span processor is shut down after the module.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry import context, metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentledger.contracts import common
from agentledger.contracts.proposals import ProposalV1
from agentledger.ledger import dispatch
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.telemetry import spans
from agentledger.testing.crm import Crm, run_crm
from tests.integration.executor_world import Tenant, World, close_world, open_world

NOTE = "crm.note.create"
REFUND = "billing.refund.create"

_reader = InMemoryMetricReader()


@pytest.fixture(scope="module")
def exported() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    yield exporter
    processor.shutdown()  # later modules' spans are not kept in memory


@pytest.fixture(scope="module")
def crm(make_database: Callable[[], str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crm]:
    with run_crm(make_database(), tmp_path_factory.mktemp("crm"), faults_enabled="true") as c:
        yield c


@pytest.fixture
async def world(crm: Crm, database_url: str, exported: InMemorySpanExporter) -> AsyncIterator[World]:
    w = await open_world(crm, database_url)
    yield w
    await crm.disarm()
    await close_world(w)


def traceparent() -> str:
    return f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"


def of(exported: InMemorySpanExporter, op: uuid.UUID, name: str | None = None) -> list[ReadableSpan]:
    return [s for s in exported.get_finished_spans()
            if (s.attributes or {}).get(spans.OPERATION_ID) == str(op) and name in (None, s.name)]


def hexid(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


async def admit(world: World, t: Tenant, action: str, arguments: dict[str, Any], tp: str) -> tuple[uuid.UUID, str]:
    op = uuid.uuid4()
    proposal = ProposalV1.model_validate_json(json.dumps({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
        "tenant_id": str(t.tenant_id), "principal_id": "user:alice", "operation_id": str(op),
        "action": action, "arguments": {"customer_id": t.customer_id, **arguments},
        "target": t.customer_id, "planner": {"name": "test"},
        "created_at": datetime.now(UTC).isoformat()}))
    result = await world.admitter().admit(proposal, trace=common.TraceContext(traceparent=tp))
    return op, result.status


async def outbox(world: World, op: uuid.UUID) -> tuple[str | None, str | None]:
    async with world.owner.acquire() as conn:
        row = await conn.fetchrow("SELECT traceparent, tracestate FROM command_outbox WHERE operation_id = $1", op)
    assert row is not None
    return row["traceparent"], row["tracestate"]


async def test_admission_and_dispatch_continue_the_proposal_trace_and_a_resend_links_to_the_first_attempt(
    world: World, exported: InMemorySpanExporter
) -> None:
    t = await world.tenant()
    tp = traceparent()
    op, status = await admit(world, t, NOTE, {"body": "call back"}, tp)
    assert status == "admitted"
    await world.crm.arm({"match": {"method": "POST", "path_prefix": f"/v1/customers/{t.customer_id}/notes"},
                         "action": "drop_after_commit", "times": 1})
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op, traceparent=(await outbox(world, op))[0])
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "succeeded"

    trace_id, parent_id = tp.split("-")[1:3]
    [admission] = of(exported, op, "admission")
    assert hexid(admission)[0] == trace_id and f"{admission.parent.span_id:016x}" == parent_id  # type: ignore[union-attr]
    assert admission.attributes is not None
    assert (admission.attributes[spans.OUTCOME], admission.attributes[spans.CONNECTOR]) == ("admitted", "crm")
    [authz] = [s for s in exported.get_finished_spans()
               if s.name == "authorization" and s.parent and s.parent.span_id == admission.context.span_id]
    assert (authz.attributes or {})[spans.EFFECT] == "allow"

    [dispatched] = of(exported, op, "dispatch")
    assert hexid(dispatched)[0] == trace_id
    assert (dispatched.attributes or {})[spans.STATE] == "succeeded"
    assert (dispatched.attributes or {})[spans.GENERATION] == 1
    first, resend = sorted(of(exported, op, "attempt"), key=lambda s: s.start_time or 0)
    for attempt in (first, resend):
        assert attempt.parent is not None and attempt.parent.span_id == dispatched.context.span_id
    assert [(s.attributes or {})[spans.ATTEMPT_KIND] for s in (first, resend)] == ["dispatch", "resend"]
    assert [(s.attributes or {})[spans.OUTCOME] for s in (first, resend)] == ["in_doubt", "applied"]
    assert not first.links
    [link] = resend.links
    assert link.context.span_id == first.context.span_id
    assert (link.attributes or {})[spans.LINK_REASON] == "first_attempt"
    # The claim recorded the dispatch span's context: what a reconciliation links to.
    async with world.owner.acquire() as conn:
        attempts = await dispatch.attempts(conn, t.tenant_id, op)
    assert attempts[0]["traceparent"].split("-")[1:3] == list(hexid(dispatched))


async def test_reconciliation_is_a_new_trace_linked_to_the_original_dispatch(
    world: World, exported: InMemorySpanExporter
) -> None:
    t = await world.tenant()
    op, _ = await admit(world, t, NOTE, {"body": "lost three times"}, traceparent())
    await world.crm.arm({"match": {"method": "POST", "path_prefix": f"/v1/customers/{t.customer_id}/notes"},
                         "action": "drop_after_commit", "times": 3})
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op, traceparent=(await outbox(world, op))[0])
    assert begun.claim is not None
    assert await worker.complete(begun.claim) == "unknown"
    assert await world.reconciler().reconcile(t.tenant_id, op, "crm", "unknown") == "succeeded"

    [dispatched] = of(exported, op, "dispatch")
    [reconciled] = of(exported, op, "reconciliation")
    assert reconciled.parent is None and hexid(reconciled)[0] != hexid(dispatched)[0]
    assert (reconciled.attributes or {})[spans.OUTCOME] == "succeeded"
    [link] = reconciled.links
    assert (link.context.trace_id, link.context.span_id) == (dispatched.context.trace_id, dispatched.context.span_id)
    assert (link.attributes or {})[spans.LINK_REASON] == "dispatch"
    [lookup] = [s for s in exported.get_finished_spans()
                if s.name == "lookup" and s.parent and s.parent.span_id == reconciled.context.span_id]
    assert lookup.kind == trace.SpanKind.CLIENT


async def test_a_dispatch_resumed_after_approval_links_to_the_approval_request(
    world: World, exported: InMemorySpanExporter
) -> None:
    t = await world.tenant()
    tp = traceparent()
    op, status = await admit(world, t, REFUND, {"invoice_id": "inv-1", "amount_minor": 1200,
                                                "currency": "EUR", "reason": "late"}, tp)
    assert status == "pending_approval"
    async with world.owner.acquire() as conn:
        approval_id = await conn.fetchval("SELECT approval_id FROM approval_request WHERE operation_id = $1", op)
    await world.approve(t, approval_id, REFUND)
    [decision] = of(exported, op, "approval.decision")
    assert (decision.attributes or {})[spans.OUTCOME] == "approved"
    [link] = decision.links
    assert f"{link.context.span_id:016x}" == tp.split("-")[2]
    # The command continues the decision's trace and names the request it resumes.
    stored_tp, stored_ts = await outbox(world, op)
    assert stored_tp is not None and stored_tp.split("-")[1:3] == list(hexid(decision))
    assert stored_ts == f"{spans.RESUMED_KEY}={tp.split('-')[1]}-{tp.split('-')[2]}"

    # As the executor sees it: FastStream's process span continues the record's context.
    token = context.attach(spans.context_from(stored_tp, stored_ts) or context.Context())
    try:
        worker = world.dispatcher()
        begun = await worker.begin(t.tenant_id, op)
    finally:
        context.detach(token)
    assert begun.claim is not None
    await worker.complete(begun.claim)
    [dispatched] = of(exported, op, "dispatch")
    assert hexid(dispatched)[0] == hexid(decision)[0]
    [resumed] = dispatched.links
    assert f"{resumed.context.trace_id:032x}-{resumed.context.span_id:016x}" == "-".join(tp.split("-")[1:3])
    assert (resumed.attributes or {})[spans.LINK_REASON] == "approval_request"


def test_a_label_outside_the_bounded_set_or_an_id_as_a_value_raises() -> None:
    meter = metrics.get_meter("test")
    with pytest.raises(telemetry_metrics.UnboundedLabel):
        telemetry_metrics.Counter(meter, "t.bad", unit="1", description="", labels=("operation_id",))
    counter = telemetry_metrics.Counter(meter, "t.good", unit="1", description="", labels=("state", "connector"))
    counter.add(1, state="succeeded", connector="crm")
    for values in ({"state": str(uuid.uuid4()), "connector": "crm"}, {"state": "succeeded", "connector": "user:alice"},
                   {"state": "succeeded"}, {"state": "succeeded", "connector": "crm", "tenant": "x"}):
        with pytest.raises(telemetry_metrics.UnboundedLabel):
            counter.add(1, **values)
    assert telemetry_metrics.bounded("not.listed", {"crm.note.create"}) == telemetry_metrics.OTHER


async def test_exported_metric_points_carry_no_operation_tenant_or_principal_id(
    world: World, exported: InMemorySpanExporter
) -> None:
    t = await world.tenant()
    op, _ = await admit(world, t, NOTE, {"body": "counted"}, traceparent())
    worker = world.dispatcher()
    begun = await worker.begin(t.tenant_id, op)
    assert begun.claim is not None
    await worker.complete(begun.claim)
    data = _reader.get_metrics_data()
    points = [(m.name, dict(p.attributes or {})) for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics for p in m.data.data_points] if data else []
    names = {name for name, _ in points}
    assert {"agentledger.admissions", "agentledger.dispatch.outcomes", "agentledger.attempt.duration",
            "agentledger.authorizations"} <= names
    forbidden = {str(op), str(t.tenant_id), "user:alice", t.customer_id}
    for name, attributes in points:
        assert not forbidden & {str(v) for v in attributes.values()}, (name, attributes)
        if name.startswith("agentledger."):
            assert set(attributes) <= telemetry_metrics.LABELS, (name, attributes)
