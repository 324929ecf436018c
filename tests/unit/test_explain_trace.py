"""``explain`` names the operation's trace, so a person can open it in a trace UI."""

from __future__ import annotations

import uuid

from agentledger.audit import explain

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _explanation(trace_id: str | None) -> explain.Explanation:
    return explain.Explanation(
        tenant_id=uuid.uuid4(), operation_id=uuid.uuid4(),
        proposed=explain.Proposed(action="crm.note.create", target="c-1", principal="user:a",
                                  planner=None, model=None, proposal_id=None, request_hash=None,
                                  allowlist_version=None, evidence=[]),
        permitted=explain.Permitted(decisions=[], approvals=[], command_decision_id=None,
                                    policy_version=None, valid_until=None),
        attempted=[], known=explain.Known(state="succeeded", receipt=None, reason=None,
                                          finished_at=None, payload_purged=False,
                                          reconciliations=[]),
        timeline=[], trace_id=trace_id)


def test_the_trace_id_is_read_from_the_stored_traceparent() -> None:
    assert explain._trace_id(TRACEPARENT) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert explain._trace_id(None) is None
    assert explain._trace_id("not a traceparent") is None


def test_the_link_needs_both_a_trace_and_a_ui() -> None:
    found = _explanation("4bf92f3577b34da6a3ce929d0e0e4736")
    assert found.trace_link("http://127.0.0.1:16686/") == \
        "http://127.0.0.1:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"
    assert found.trace_link(None) is None
    assert _explanation(None).trace_link("http://127.0.0.1:16686") is None


def test_the_json_shape_keeps_its_keys() -> None:
    """The console and ``explain --json`` readers index these keys: the typed model keeps them."""
    dumped = _explanation(None).model_dump(mode="json")
    assert set(dumped) == {"tenant_id", "operation_id", "proposed", "permitted", "attempted",
                           "known", "timeline", "trace_id"}
    # Keys only ever added (issue 37: what a provider said after the ledger decided).
    assert set(dumped["known"]) == {"state", "receipt", "reason", "finished_at",
                                    "payload_purged", "reconciliations", "contradicted_at",
                                    "contradiction"}


def test_explain_prints_the_trace_link_when_a_trace_ui_is_configured() -> None:
    from rich.console import Console

    from agentledger.cli import explain as cli_explain

    found = _explanation("4bf92f3577b34da6a3ce929d0e0e4736")
    shown = Console(record=True, width=200)
    cli_explain.render(found, shown, "http://127.0.0.1:16686")
    assert "trace     http://127.0.0.1:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736" in \
        shown.export_text()
    unlinked = Console(record=True, width=200)
    cli_explain.render(found, unlinked, None)
    assert "trace 4bf92f3577b34da6a3ce929d0e0e4736 (set AGENTLEDGER_TRACES_URL" in \
        unlinked.export_text()
