"""Which run a tool call is a step of: the steps of one run share its budgets (R7).

Ingress binds a proposal to the run its gateway names (the ``AgentLedger-Run`` header), and
derives the run id from the verified tenant and principal and that name
(:func:`agentledger.identity.derive_run_id`): the same name from another tenant or principal
is another run. The server names, first found:

- the call's ``run`` argument: a handle ``agentledger_open_run`` answered (runs as handles,
  passed as arguments, as MCP 2026-07-28 asks instead of a transport's lifetime);
- the call's ``_meta["dev.agentledger/run"]`` (``META_RUN``; the older ``"agentledger/run"``
  is still read): one call, one named run;
- over streamable HTTP, the MCP request's ``AgentLedger-Run`` header (``HEADER``): a client
  sets it once per session, like its ``Authorization`` header, so every call of the session
  is a step of one run;
- over stdio, the configured ``AGENTLEDGER_MCP_RUN``: the run of the one agent this process
  serves (its whole life is one run, so start one process per run);
- none: the call is its own run, as without this module.

The run does not change which operation a call is (:mod:`agentledger.mcp.idempotency`): a
retried call is the same operation whatever run it names, and never acts twice.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, Final

from agentledger import errors, identity
from agentledger.mcp import idempotency, results, tools

META_RUN: Final = "dev.agentledger/run"
LEGACY_META_RUN: Final = "agentledger/run"
HEADER: Final = "agentledger-run"


def session_run(request: Any, configured: str | None) -> str | None:
    """The run of the MCP session a request belongs to: the ``AgentLedger-Run`` header of
    ``request`` (the HTTP request the transport attached), or ``configured`` on stdio
    (``request`` is ``None``)."""
    if request is not None:
        found = request.headers.get(HEADER)
        return found if isinstance(found, str) else None
    return configured


def run_for(meta: Mapping[str, Any] | None, session: str | None) -> str | None:
    """The run a tool call is a step of: ``_meta``'s, else the session's, else none.

    Raises:
        errors.ValidationFailed: The run named is not 1-128 characters of
            ``A-Z a-z 0-9 . _ : ~ -`` starting with a letter or digit (what ingress accepts).
    """
    given = idempotency.meta_value(meta, META_RUN, LEGACY_META_RUN)
    run = session if given is None else given
    if run is None:
        return None
    if not isinstance(run, str) or not identity.is_run_name(run):
        where = f"_meta[{META_RUN!r}]" if given is not None else "the session's run"
        raise errors.ValidationFailed(
            f"{where} must be 1-128 characters of A-Z a-z 0-9 . _ : ~ -, starting with a "
            "letter or digit")
    return run


def opened(tool_input: Mapping[str, Any]) -> results.Answer:
    """The answer of the run opener: a new handle (``run-`` + 32 random hex digits). Nothing
    is kept: ingress derives the run from the caller's tenant and principal and this name,
    so the handle is the run, on any replica, and means nothing to another principal."""
    if tool_input:
        return results.Answer("refused", code="invalid_arguments",
                              reason=f"{tools.OPEN_RUN_TOOL} takes no arguments")
    return results.Answer("run_opened", run=f"run-{secrets.token_hex(16)}")
