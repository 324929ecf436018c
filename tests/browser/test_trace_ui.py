"""Traces a person can look at: the lost-response story's trace, exported over OTLP by the real
services to a real Jaeger, opened in its UI, where the resend's span links to the first attempt.

The operation's trace id comes from ``agentledger explain`` (the audit ledger), so the link the
CLI and the demo print is the one checked here.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from agentledger import db
from agentledger.audit import explain as audit_explain
from agentledger.testing import jaeger as jaeger_kit
from agentledger.testing.pipeline import Pipeline, pipeline
from agentledger.testing.polling import wait_until
from tests.browser.conftest import PAGE_TIMEOUT_MS
from tests.browser.support import sync
from tests.stack import Stack

SERVICES = ("relay", "admission", "executor-crm", "executor-billing", "reconciler")
NOTES = "/v1/customers/"
# Where `AGENTLEDGER_REFRESH_DOC_IMAGES=1` writes the picture docs/operations.md shows.
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "lost-response-trace.png"


@dataclass
class Traced:
    p: Pipeline
    jaeger: jaeger_kit.Jaeger


@pytest.fixture(scope="module")
def traced(stack: Stack, database_url: str, make_database: Callable[[], str],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    with jaeger_kit.running() as jaeger, pipeline(
            stack.kafka_bootstrap, database_url, make_database(), tmp_path_factory.mktemp("traced"),
            env={name: jaeger.otel_env() for name in SERVICES}) as p:
        yield Traced(p, jaeger)


def explained(p: Pipeline, op: uuid.UUID) -> audit_explain.Explanation:
    async def run() -> audit_explain.Explanation:
        conn = await db.connect(p.database_url, role="agentledger_auditor")
        try:
            return await audit_explain.explain(conn, uuid.UUID(p.tenant), op)
        finally:
            await conn.close()
    return sync(run())


def attempts(trace: dict[str, Any] | None) -> list[dict[str, Any]]:
    spans = (trace or {}).get("spans", [])
    return sorted((s for s in spans if s["operationName"] == "attempt"),
                  key=lambda s: s["startTime"])


def tag(span: dict[str, Any], key: str) -> Any:
    return next((t["value"] for t in span["tags"] if t["key"] == key), None)


def test_the_lost_response_trace_shows_the_resend_linked_to_the_first_attempt(
        traced: Traced, browser: Browser) -> None:
    p, jaeger = traced.p, traced.jaeger
    sync(p.crm.arm({"match": {"method": "POST", "path_prefix": NOTES},
                           "action": "drop_after_commit", "times": 1}))
    op = p.propose("crm.note.create", {"body": "answer lost once, seen in Jaeger"})
    p.wait_state(op, "succeeded")

    # explain names the trace; Jaeger holds it, with both attempts (the services export in
    # batches, so poll until the executor's spans are in).
    found = explained(p, op)
    assert [(a.kind, a.result) for a in found.attempted] == [("dispatch", "unknown"),
                                                              ("resend", "succeeded")]
    assert found.trace_id is not None and len(found.trace_id) == 32
    wanted = {"agentledger-admission", "agentledger-relay", "agentledger-executor"}

    def complete(trace: dict[str, Any] | None) -> bool:
        """Each service exports in its own batches: the trace is whole once every service's
        spans and both attempts are in."""
        names = {proc["serviceName"] for proc in (trace or {}).get("processes", {}).values()}
        return wanted <= names and len(attempts(trace)) == 2

    assert wait_until(lambda: complete(jaeger.trace(found.trace_id)), timeout=30), (
        jaeger.services(), jaeger.trace(found.trace_id))
    trace = jaeger.trace(found.trace_id)
    assert trace is not None
    first, resend = attempts(trace)
    assert (tag(first, "agentledger.attempt.kind"), tag(resend, "agentledger.attempt.kind")) == (
        "dispatch", "resend")
    assert (tag(first, "agentledger.outcome"), tag(resend, "agentledger.outcome")) == (
        "in_doubt", "applied")
    # The span link (OTel) is a FOLLOWS_FROM reference in Jaeger's model, to the first attempt.
    links = [r for r in resend["references"] if r["refType"] == "FOLLOWS_FROM"]
    assert [(r["traceID"], r["spanID"]) for r in links] == [(first["traceID"], first["spanID"])]

    # In the UI: the trace page lists both attempts; the resend's detail shows its reference,
    # which names the first attempt's span.
    link = found.trace_link(jaeger.ui_url)
    assert link == jaeger.trace_url(found.trace_id)
    page = browser.new_page(viewport={"width": 1500, "height": 900})
    try:
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        page.goto(link)
        rows = page.locator(".span-row").filter(has_text="attempt")
        expect(rows).to_have_count(2)
        rows.nth(1).locator(".span-name").click()
        detail = page.locator(".detail-row").first
        expect(detail).to_contain_text("resend")
        detail.locator(".AccordianReferences--header").click()
        items = detail.locator(".ReferencesList--Item")
        expect(items).to_have_count(2)  # its parent (the dispatch) and the link
        linked = items.filter(has_text="FOLLOWS_FROM")
        expect(linked).to_have_count(1)
        expect(linked).to_contain_text("attempt")
        expect(linked).to_contain_text(first["spanID"])
        expect(items.filter(has_text="CHILD_OF")).to_contain_text("dispatch")
        if os.environ.get("AGENTLEDGER_REFRESH_DOC_IMAGES") == "1":
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
    finally:
        page.close()
