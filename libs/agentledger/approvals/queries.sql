-- Approval requests (SPEC R2). Loaded by repository.py; bound parameters only.

-- name: pending_for_operation --
-- The open request of an intent, locked: a revision or a decision must not race it.
SELECT * FROM approval_request
WHERE tenant_id = $1 AND operation_id = $2 AND state = 'pending'
FOR UPDATE;

-- name: proposal_with_other_content --
-- Whether this proposal id of the intent was requested with another hash (a replay).
SELECT EXISTS (
  SELECT 1 FROM approval_request
  WHERE tenant_id = $1 AND operation_id = $2 AND proposal_id = $3 AND request_hash <> $4
);

-- name: insert_request --
-- A new pending request binding the hash and every field behind it.
INSERT INTO approval_request (
  approval_id, tenant_id, operation_id, proposal_id, principal_id, action, connector,
  resource_id, expected_revision, request_hash, payload_ciphertext, payload_key_version,
  policy_version, allowlist_version, decision_id, risk, evidence, expires_at, traceparent,
  tracestate, evidence_ciphertext, evidence_key_version, required_approvals, approver_role,
  quorum_rule
) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
          $19, $20, $21, $22, $23, $24, $25)
RETURNING *;

-- name: approver_roles --
-- The roles the directory gives a principal now (a quorum's role is checked against them).
SELECT roles FROM principal WHERE tenant_id = $1 AND principal_id = $2 AND revoked_at IS NULL;

-- name: add_vote --
-- One approver's approval of exactly this hash; the same approver again changes nothing.
INSERT INTO approval_vote (tenant_id, approval_id, approver, request_hash, decision_id)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tenant_id, approval_id, approver) DO NOTHING;

-- name: votes --
-- The approvals a request has gathered, in order (for the quorum, explain and the console).
SELECT approver, request_hash, decision_id, voted_at FROM approval_vote
WHERE tenant_id = $1 AND approval_id = $2 ORDER BY voted_at, approver;

-- name: supersede --
-- A revised proposal (or a changed target) replaces the pending request; it is never reused.
UPDATE approval_request
SET state = 'superseded', decided_at = now(), decided_by = $3, decision_reason = $4,
    superseded_by = $5
WHERE tenant_id = $1 AND approval_id = $2 AND state = 'pending';

-- name: link_superseded --
-- Point a superseded request at the one that replaced it.
UPDATE approval_request SET superseded_by = $3
WHERE tenant_id = $1 AND approval_id = $2 AND state = 'superseded';

-- name: lock_request --
-- One request, locked for a decision.
SELECT * FROM approval_request WHERE tenant_id = $1 AND approval_id = $2 FOR UPDATE;

-- name: get_request --
-- One request as stored.
SELECT * FROM approval_request WHERE tenant_id = $1 AND approval_id = $2;

-- name: list_requests --
-- A tenant's requests in one state, oldest first.
SELECT * FROM approval_request WHERE tenant_id = $1 AND state = $2
ORDER BY created_at LIMIT $3;

-- name: requests_for_operation --
-- Every request an intent has had, oldest first (for `explain`).
SELECT * FROM approval_request WHERE tenant_id = $1 AND operation_id = $2 ORDER BY created_at;

-- name: close_request --
-- Record a decision on a pending request: approved, denied or expired.
UPDATE approval_request
SET state = $3, decided_by = $4, decided_at = now(), decision_reason = $5,
    approval_decision_id = $6, shown_hash = $7
WHERE tenant_id = $1 AND approval_id = $2 AND state = 'pending'
RETURNING *;

-- name: expire_due --
-- Expire pending requests past their expiry, across tenants (reconciler; see 0005).
SELECT tenant_id, operation_id, approval_id FROM agentledger_expire_approvals($1);
