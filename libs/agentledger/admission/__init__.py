"""Admission: the only place that turns a proposal into an approved, persisted command (R1.6).

Order of checks: the identity envelope signed by ingress must verify and bind the proposal's
tenant, principal and operation id (R1.1); shadow runs are refused (R9.2); the action must be
on the versioned allowlist (R1.2) and its arguments satisfy the closed schema (R1.3); the
target must resolve inside the tenant at the expected revision (R1.4); the current policy
decides allow / require approval / deny, and the decision is persisted (R2.9). Then the
request hash is computed over the validated fields (R2.2), the payload is encrypted (R3.6),
and the command is admitted once (R4) — or persisted as a pending approval request (R2.8).
A target check that fails for an operation id the ledger already holds is answered from the
ledger (``replayed`` or ``conflict``): a redelivered proposal whose own command moved the
revision did run, and must not be told it was stale.

Modules, one concept each: ``checks`` runs the checks before the policy (writing nothing),
``transaction`` decides and writes in admission's transaction (per proposal or per batch of a
tenant's proposals), ``answers`` builds the answers and the audit record of a proposal, and
``admitter`` takes one proposal through them. Start with :class:`Admitter`.

``from agentledger import admission`` → ``admission.Admitter(...)``.
"""

from agentledger.admission.admitter import (
    DEFAULT_APPROVAL_TTL,
    DEFAULT_DECISION_TTL,
    AdmissionResultV1,
    Admitter,
)
from agentledger.admission.answers import budget_refusal, recorded_outcome

__all__ = ["DEFAULT_APPROVAL_TTL", "DEFAULT_DECISION_TTL", "AdmissionResultV1", "Admitter",
           "budget_refusal", "recorded_outcome"]
