"""Human approvals: persisted, hash-bound, expiring (SPEC R2.1-R2.5, R2.8).

``from agentledger import approvals`` → ``approvals.request``, ``approvals.decide``, ...
"""

from agentledger.approvals.repository import (
    Approval,
    NewApproval,
    Requested,
    decide,
    evidence_aad,
    expire_due,
    get,
    history,
    listing,
    request,
)

__all__ = ["Approval", "NewApproval", "Requested", "decide", "evidence_aad", "expire_due", "get",
           "history", "listing", "request"]
