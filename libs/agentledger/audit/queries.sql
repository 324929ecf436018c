-- Reads behind `explain` (SPEC R8.6). Every query is tenant-bound by row security as well.

-- name: command --
-- The command as admitted and as it stands.
SELECT operation_id, request_hash, state, provider_receipt, outcome_reason, principal_id,
       action, connector, resource_id, expected_revision, decision_id, policy_version,
       allowlist_version, expires_at, created_at, dispatched_at, finished_at,
       fencing_generation, payload_purged_at, contradicted_at, contradiction
FROM agent_command WHERE tenant_id = $1 AND operation_id = $2;

-- name: decisions --
-- Every policy decision about the operation, oldest first.
SELECT decision_id, stage, effect, policy_version, reasons, reason, principal_id, decided_at
FROM policy_decision WHERE tenant_id = $1 AND operation_id = $2 ORDER BY decided_at;

-- name: approvals --
-- Every approval request the intent had.
SELECT approval_id, state, request_hash, policy_version, risk, evidence, expires_at, created_at,
       action, resource_id,
       decided_by, decided_at, decision_reason, approval_decision_id, superseded_by, principal_id,
       required_approvals, approver_role, narrowed_from,
       (SELECT n.approval_id FROM approval_request n
        WHERE n.tenant_id = a.tenant_id AND n.narrowed_from = a.approval_id) AS narrowed_to,
       coalesce((SELECT jsonb_agg(v.approver ORDER BY v.voted_at, v.approver)
                 FROM approval_vote v
                 WHERE v.tenant_id = a.tenant_id AND v.approval_id = a.approval_id),
                '[]'::jsonb) AS approved_by
FROM approval_request a WHERE tenant_id = $1 AND operation_id = $2 ORDER BY created_at;

-- name: attempts --
-- Every execution attempt.
SELECT attempt_id, kind, worker_id, fencing_generation, started_at, finished_at, result, detail,
       late_answer, late_receipt, late_at
FROM command_attempt WHERE tenant_id = $1 AND operation_id = $2 ORDER BY started_at, attempt_id;

-- name: resolutions --
-- Operator reconciliations.
SELECT resolved_by, resolved_at, outcome, receipt, reason, evidence, provisional
FROM command_resolution WHERE tenant_id = $1 AND operation_id = $2 ORDER BY resolved_at;

-- name: events --
-- The audit ledger's events for the operation, in the order they were recorded.
SELECT event_id, seq, type, payload, recorded_at, traceparent
FROM audit_event WHERE tenant_id = $1 AND operation_id = $2 ORDER BY seq;

-- name: budget_charges --
-- What the operation was charged against the operator's budgets (issue 42), and whether the
-- charge is still reserved, settled or released.
SELECT budget, scope, scope_key, window_kind, window_start, unit, currency, amount,
       limit_amount, state, created_at, settled_at
FROM budget_charge WHERE tenant_id = $1 AND operation_id = $2 ORDER BY created_at, budget;
