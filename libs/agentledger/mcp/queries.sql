-- What the MCP server reads from the ledger (as agentledger_auditor, read only): what is
-- known of one operation, for the status tool. The tenant is bound by the caller's
-- transaction (row-level security).

-- name: operation_known --
-- The operation's command (admitted) or its latest approval request (waiting or decided):
-- who proposed it, and what is recorded.
SELECT c.principal_id AS command_principal, c.state, c.provider_receipt, c.outcome_reason,
       c.created_at AS admitted_at, c.updated_at AS command_updated_at,
       a.approval_id, a.principal_id AS approval_principal, a.state AS approval_state,
       a.created_at AS requested_at, a.decided_at, a.decision_reason
FROM (SELECT $2::uuid AS operation_id) AS asked
LEFT JOIN agent_command AS c ON c.tenant_id = $1 AND c.operation_id = asked.operation_id
LEFT JOIN LATERAL (
    SELECT approval_id, principal_id, state, created_at, decided_at, decision_reason
    FROM approval_request
    WHERE tenant_id = $1 AND operation_id = asked.operation_id
    ORDER BY created_at DESC
    LIMIT 1
) AS a ON true;
