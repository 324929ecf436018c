"""Telemetry: OpenTelemetry set-up, span conventions and bounded metrics (SPEC R8.1-R8.5).

Traces help engineers; the audit ledger (``agentledger.audit``) is what the business relies
on. Spans carry ids and bounded names only — never prompts, tokens, payloads, evidence text
or business records (R8.5); metric labels are bounded names, never ids (R8.3).

- ``configure.setup(service)``: SDK from ``OTEL_*``; nothing exported unless configured.
- ``spans``: attribute names, ``span()``, context from stored ``traceparent`` values, links.
- ``metrics``: the project's instruments; a label outside the bounded set raises.
- ``files``: the ``AGENTLEDGER_TELEMETRY_FILE`` JSON-lines hook for tests.
"""

from agentledger.telemetry.configure import FILE_ENV, Telemetry, setup

__all__ = ["FILE_ENV", "Telemetry", "setup"]
