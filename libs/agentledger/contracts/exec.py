"""``exec.<connector>.v1``: the wake-up call for an executor, never the command itself.

The executor loads the command from the ledger by ``(tenant_id, operation_id)`` (R1.6), so
nothing in this body can change what gets dispatched.
"""

from typing import Literal

from agentledger.contracts import common


class ExecRequestV1(common.Contract):
    """Asks the connector's executors to dispatch one admitted command."""

    tenant_id: common.TenantId
    operation_id: common.OperationId
    # `command.requeued`: a new dispatch obligation after recovery proved resending safe.
    # `command.republished`: the first obligation was published and no executor claimed
    # the command in time (the reconciler renews it; nothing was ever sent).
    type: Literal["command.admitted", "command.requeued", "command.republished"] = (
        "command.admitted")
