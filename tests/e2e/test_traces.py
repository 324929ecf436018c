"""Trace shape, links, bounded metrics and no sensitive data, across the real processes (R8).

Every service (and a planner) runs with ``AGENTLEDGER_TELEMETRY_FILE``: its spans, metric
points and log records land as JSON lines in this module's log directory, next to the
processes' captured stdout/stderr. The analytics example runs against the audit topic here.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer

from agentledger import identity, settings
from agentledger.contracts.requests import RequestV1
from agentledger.telemetry import metrics as telemetry_metrics
from agentledger.testing import identities, processes
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.stack import Stack

SERVICES = ("relay", "admission", "executor-crm", "executor-billing", "reconciler")
NOTES = "/v1/customers/"


@dataclass
class World:
    p: Pipeline
    logs: Path
    planner: processes.Service

    def records(self) -> list[dict[str, Any]]:
        """Every exported span, metric point and log record of every service so far."""
        out: list[dict[str, Any]] = []
        for path in sorted(self.logs.glob("telemetry-*.jsonl")):
            # Only whole lines: the services append while we read, and a batch can be cut mid-line.
            text = path.read_text()
            out += [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]
        return out

    def spans(self, op: uuid.UUID, name: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.records() if r["signal"] == "span"
                and r["attributes"].get("agentledger.operation_id") == str(op) and name in (None, r["name"])]

    def wait_spans(self, op: uuid.UUID, name: str, count: int = 1) -> list[dict[str, Any]]:
        assert wait_until(lambda: len(self.spans(op, name)) >= count, timeout=30), (name, self.spans(op))
        return sorted(self.spans(op, name), key=lambda s: s["start_ns"])


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    logs = tmp_path_factory.mktemp("traces")
    env = {name: {"AGENTLEDGER_TELEMETRY_FILE": str(logs / f"telemetry-{name}.jsonl")} for name in SERVICES}
    with ExitStack() as stack_:
        p = stack_.enter_context(pipeline(stack.kafka_bootstrap, database_url, make_database(), logs, env=env))
        group = f"planner-{p.ns.rstrip('.')}"
        planner = stack_.enter_context(processes.running("agentledger.services.planner", {
            "AGENTLEDGER_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
            "AGENTLEDGER_PLANNER_ENVELOPE_KEYS": json.dumps(identities.ENVELOPE_KEYS),
            "AGENTLEDGER_PLANNER_CRM_URL": p.crm.url,
            "AGENTLEDGER_PLANNER_CRM_READ_TOKENS": json.dumps({p.tenant: p.tokens["read"]}),
            "AGENTLEDGER_PLANNER_REQUESTS_TOPIC": p.topic("agent.requests.v1"),
            "AGENTLEDGER_PLANNER_PROPOSALS_TOPIC": p.topic("agent.proposals.v1"),
            "AGENTLEDGER_PLANNER_GROUP_ID": group, "AGENTLEDGER_PLANNER_PARTITIONS": "3",
            "AGENTLEDGER_TELEMETRY_FILE": str(logs / "telemetry-planner.jsonl")},
            logs / "planner.log", ready=processes.group_has_members(stack.kafka_bootstrap, group), timeout=90))
        yield World(p, logs, planner)


@pytest.fixture(autouse=True)
def disarmed(world: World) -> Iterator[None]:
    """A test's fault rule, used up or not, never fires in the next test."""
    yield
    asyncio.run(world.p.crm.disarm())


def exec_headers(world: World, op: uuid.UUID) -> list[list[tuple[str, bytes]]]:
    """The header lists of the exec records of ``op``."""
    consumer = Consumer({"bootstrap.servers": world.p.bootstrap, "group.id": f"h-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([world.p.topic("exec.crm.v1")])
    found: list[list[tuple[str, bytes]]] = []
    key = f"{world.p.tenant}:{op}".encode()

    def poll() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None and msg.key() == key:
            found.append([(k, v or b"") for k, v in msg.headers() or []])
        return bool(found)
    try:
        wait_until(poll, timeout=30, interval=0)
    finally:
        consumer.close()
    return found


def test_admission_relay_and_dispatch_share_one_trace(world: World) -> None:
    op = world.p.propose("crm.note.create", {"body": "one trace"})
    world.p.wait_state(op, "succeeded")
    [admission] = world.wait_spans(op, "admission")
    dispatched = world.wait_spans(op, "dispatch")[0]
    attempt = world.wait_spans(op, "attempt")[0]
    relayed = [s for s in world.wait_spans(op, "relay.publish", 2)
               if s["attributes"]["agentledger.topic.family"] == "exec"]
    assert [admission["service"], relayed[0]["service"], dispatched["service"]] == [
        "agentledger-admission", "agentledger-relay", "agentledger-executor"]
    assert {admission["trace_id"], relayed[0]["trace_id"], dispatched["trace_id"], attempt["trace_id"]} == {
        admission["trace_id"]}
    assert attempt["parent_span_id"] == dispatched["span_id"]
    # The exec record carries exactly one traceparent: the context captured at admission,
    # which the relay span is a child of.
    [headers] = exec_headers(world, op)
    traceparents = [v.decode() for k, v in headers if k == "traceparent"]
    assert len(traceparents) == 1
    _, trace_id, span_id, _ = traceparents[0].split("-")
    assert trace_id == admission["trace_id"] and relayed[0]["parent_span_id"] == span_id


def test_a_resend_is_a_span_linked_to_the_first_attempt(world: World) -> None:
    asyncio.run(world.p.crm.arm({"match": {"method": "POST", "path_prefix": NOTES},
                                 "action": "drop_after_commit", "times": 1}))
    op = world.p.propose("crm.note.create", {"body": "answer lost once"})
    world.p.wait_state(op, "succeeded")
    first, resend = world.wait_spans(op, "attempt", 2)
    assert (first["attributes"]["agentledger.attempt.kind"], resend["attributes"]["agentledger.attempt.kind"]) == (
        "dispatch", "resend")
    assert (first["attributes"]["agentledger.outcome"], resend["attributes"]["agentledger.outcome"]) == (
        "in_doubt", "applied")
    assert resend["links"] == [{"trace_id": first["trace_id"], "span_id": first["span_id"],
                                "attributes": {"agentledger.link": "first_attempt"}}]
    assert first["parent_span_id"] == resend["parent_span_id"]


def test_a_reconciliation_span_links_to_the_dispatch(world: World) -> None:
    # Every send of the note loses its answer: unknown, then the reconciler looks it up.
    asyncio.run(world.p.crm.arm({"match": {"method": "POST", "path_prefix": NOTES},
                                 "action": "drop_after_commit", "times": 3}))
    op = world.p.propose("crm.note.create", {"body": "answer lost every time"})
    world.p.wait_state(op, "succeeded", timeout=90)
    [dispatched] = world.wait_spans(op, "dispatch")
    assert dispatched["attributes"]["agentledger.state"] == "unknown"
    reconciled = world.wait_spans(op, "reconciliation")[-1]
    assert reconciled["service"] == "agentledger-reconciler"
    assert reconciled["attributes"]["agentledger.outcome"] == "succeeded"
    assert reconciled["trace_id"] != dispatched["trace_id"]
    assert {"trace_id": dispatched["trace_id"], "span_id": dispatched["span_id"],
            "attributes": {"agentledger.link": "dispatch"}} in reconciled["links"]


def test_no_prompt_token_payload_or_evidence_text_reaches_telemetry_or_logs(world: World) -> None:
    mark = uuid.uuid4().hex[:12]
    markers = {f"GOAL{mark}", f"ARG{mark}", f"EVIDENCE{mark}", f"RECORD{mark}"}
    p = world.p
    # A record whose text the planner retrieves as evidence, and a goal that becomes an argument.
    customer = f"c-marker-{mark}"
    asyncio.run(p.crm.customer(p.tenant, customer, display_name=f"Ada RECORD{mark}"))
    planned = uuid.uuid4()
    envelope = identities.SIGNER.sign(tenant_id=uuid.UUID(p.tenant), principal_id="user:alice",
                                      operation_id=planned, request_id=(request_id := uuid.uuid4()),
                                      binding=identity.request_binding(goal=f"add a note: GOAL{mark}",
                                                                       resource=customer))
    request = RequestV1(request_id=request_id, tenant_id=uuid.UUID(p.tenant), principal_id="user:alice",
                        operation_id=planned, goal=f"add a note: GOAL{mark}", resource=customer,
                        identity=envelope, created_at=datetime.now(UTC))
    producer = p.producer()
    producer.produce(p.topic("agent.requests.v1"), key=p.tenant.encode(),
                     value=request.model_dump_json(by_alias=True).encode(),
                     headers=[("traceparent", f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01".encode())])
    # A direct proposal with a marker in its arguments and in an evidence excerpt.
    direct = uuid.uuid4()
    body = identities.sign({
        "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()), "tenant_id": p.tenant,
        "principal_id": "user:alice", "operation_id": str(direct), "action": "crm.note.create",
        "arguments": {"customer_id": p.customer, "body": f"ARG{mark}"}, "target": p.customer,
        "planner": {"name": "e2e"}, "created_at": datetime.now(UTC).isoformat(),
        "evidence": [{"ref": "E1", "source": f"crm:customers/{p.customer}", "sha256": "0" * 64,
                      "fetched_at": datetime.now(UTC).isoformat(), "excerpt": f"EVIDENCE{mark}"}]})
    producer.produce(p.topic("agent.proposals.v1"), key=p.tenant.encode(), value=json.dumps(body).encode())
    assert producer.flush(15) == 0
    p.wait_state(planned, "succeeded")
    p.wait_state(direct, "succeeded")
    # The markers did flow through the pipeline: the CRM holds both notes.
    notes = json.dumps(asyncio.run(p.crm.effects(p.tenant)))
    assert str(planned) in notes and str(direct) in notes
    secrets = {*p.tokens.values(), envelope, body["identity"]}
    world.wait_spans(planned, "attempt")
    world.wait_spans(direct, "attempt")
    # The last thing written for each: the relay publishing its outcome. Only after that can
    # the absence of the markers below mean anything.
    for op in (planned, direct):
        assert wait_until(lambda op=op: any(s["attributes"]["agentledger.topic.family"] == "outcome"
                                            for s in world.spans(op, "relay.publish")),
                          timeout=30), world.spans(op, "relay.publish")
    assert wait_until(lambda: any(r["signal"] == "metric" and r["service"] == "agentledger-executor"
                                  for r in world.records()), timeout=15)
    texts = {path.name: path.read_text(errors="replace") for path in world.logs.iterdir() if path.is_file()
             and not path.name.startswith("crm")}  # the CRM stands for the business system itself
    assert {f"telemetry-{n}.jsonl" for n in (*SERVICES, "planner")} <= set(texts)
    assert {"admission.log", "relay.log", "executor-crm.log", "planner.log"} <= set(texts)
    for name, text in texts.items():
        for needle in markers | secrets:
            assert needle not in text, f"{needle[:16]}... found in {name}"


def test_metric_points_have_bounded_labels_never_ids(world: World) -> None:
    # Its own command, so that it holds run alone or in any order: metrics of a whole
    # admission, relay and dispatch, and spans carrying an operation id to look for.
    op = world.p.propose("crm.note.create", {"body": "measured"})
    world.p.wait_state(op, "succeeded")
    world.wait_spans(op, "attempt")
    wanted = {"agentledger.admissions", "agentledger.dispatch.outcomes", "agentledger.attempt.duration",
              "agentledger.relay.published", "messaging.process.duration"}
    assert wait_until(lambda: wanted <= {r["name"] for r in world.records() if r["signal"] == "metric"},
                      timeout=30), wanted - {r["name"] for r in world.records() if r["signal"] == "metric"}
    points = [r for r in world.records() if r["signal"] == "metric"]
    ops = {s["attributes"]["agentledger.operation_id"] for s in world.records()
           if s["signal"] == "span" and "agentledger.operation_id" in s["attributes"]}
    forbidden = ops | {world.p.tenant, "user:alice", "user:fiona", world.p.customer}
    assert ops and points
    for point in points:
        values = {str(v) for v in point["attributes"].values()}
        assert not values & forbidden, point
        assert not any(_is_uuid(v) for v in values), point
        if point["name"].startswith("agentledger.") and not point["name"].startswith("agentledger.relay."):
            assert set(point["attributes"]) <= telemetry_metrics.LABELS, point


def test_the_analytics_example_counts_outcomes_per_action_and_connector(world: World) -> None:
    op = world.p.propose("crm.note.create", {"body": "counted by analytics"})
    world.p.wait_state(op, "succeeded")
    audit = world.p.read("audit.events.v1", lambda v: v.get("operation_id") == str(op) and v.get("state") == "succeeded")
    assert audit
    done = subprocess.run(
        [sys.executable, str(settings.REPO_ROOT / "examples" / "analytics" / "outcomes.py"),
         "--bootstrap", world.p.bootstrap, "--topic", world.p.topic("audit.events.v1"), "--since", "1h", "--json"],
        capture_output=True, text=True, timeout=90, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    notes = {r["outcome"]: r["count"] for r in rows if (r["action"], r["connector"]) == ("crm.note.create", "crm")}
    assert notes.get("succeeded", 0) >= 1, done.stdout
    assert all(r["count"] > 0 and r["action"] != "?" for r in rows), done.stdout
    empty = subprocess.run(
        [sys.executable, str(settings.REPO_ROOT / "examples" / "analytics" / "outcomes.py"),
         "--bootstrap", world.p.bootstrap, "--topic", world.p.topic("audit.events.v1"),
         "--since", "2h", "--until", "1h", "--json"], capture_output=True, text=True, timeout=90, check=True)
    assert empty.stdout.strip() == ""


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
