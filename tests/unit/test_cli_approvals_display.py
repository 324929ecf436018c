"""`agentledger approvals show` prints untrusted text inert (issue 17)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from agentledger.cli import approvals as cli_approvals


def test_escape_sequences_and_bidi_overrides_in_a_request_print_as_visible_codes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(cli_approvals, "console", Console(file=out, width=200, color_system=None))
    cli_approvals._show({
        "action": "billing.refund.create", "target": "c-1", "state": "pending",
        "principal": "user:alice", "risk": "high", "seconds_left": 600,
        "current": {"revision": "3"}, "changes": [],
        "arguments": {"customer_id": "c-1", "amount_minor": 1999, "reason": "late \u202e0009"},
        "evidence": [{"ref": "E1", "source": "crm:customers/c-1",
                      # Cursor up, erase the line: would overwrite the amount printed before it.
                      "excerpt": "note\x1b[1A\x1b[2K amount_minor: 1\r\x9b"}],
        "request_hash": "ab" * 32, "policy_version": "sha256:x",
    })
    text = out.getvalue()
    assert not any(c in text for c in "\x1b\r\x9b\u202e"), repr(text)
    assert "\\u001b[1A\\u001b[2K amount_minor: 1\\u000d\\u009b" in text
    assert "u202e0009" in text  # inside the JSON of the arguments, visible
    # The untrusted evidence comes before what the approver decides on.
    assert text.index("UNTRUSTED evidence") < text.index("proposed arguments") < text.index("request hash")
