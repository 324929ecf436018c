-- Every statement about policy data: the principal directory and the decision records.
-- Loaded once by repository.py; bound parameters only; the tenant is bound by the caller's
-- transaction (row-level security).

-- name: lookup_principal --
-- Roles and revocation of one principal, read at each evaluation so a revocation is seen.
SELECT tenant_id, principal_id, roles, revoked_at IS NOT NULL AND revoked_at <= now() AS revoked
FROM principal
WHERE tenant_id = $1 AND principal_id = $2;

-- name: lookup_principals --
-- `lookup_principal` for every principal of an admission batch ($2) in one statement.
SELECT tenant_id, principal_id, roles, revoked_at IS NOT NULL AND revoked_at <= now() AS revoked
FROM principal
WHERE tenant_id = $1 AND principal_id = ANY($2::text[]);

-- name: put_principal --
-- Create a principal or replace its roles; un-revokes it (a deliberate reinstatement).
INSERT INTO principal (tenant_id, principal_id, roles)
VALUES ($1, $2, $3::jsonb)
ON CONFLICT (tenant_id, principal_id)
DO UPDATE SET roles = EXCLUDED.roles, revoked_at = NULL, updated_at = now();

-- name: revoke_principal --
-- Revoke once; revoking again keeps the first revocation time. Returns the rows touched.
UPDATE principal SET revoked_at = coalesce(revoked_at, now()), updated_at = now()
WHERE tenant_id = $1 AND principal_id = $2
RETURNING revoked_at;

-- name: record_decision --
-- One decision, written in the caller's transaction; recording the same decision id twice
-- (a retried transaction that did commit) keeps the first record.
INSERT INTO policy_decision (decision_id, tenant_id, principal_id, action, resource_id, effect,
                             policy_version, reasons, reason, stage, operation_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11)
ON CONFLICT (decision_id) DO NOTHING;

-- name: decisions_for --
-- Every decision taken about one operation, oldest first (explain, R8.6).
SELECT decision_id, tenant_id, principal_id, action, resource_id, effect, policy_version,
       reasons, reason, stage, operation_id, decided_at
FROM policy_decision
WHERE tenant_id = $1 AND operation_id = $2
ORDER BY decided_at, decision_id;

-- name: create_principal --
-- A principal with no roles yet, unless it exists (a grant to a new principal creates it).
-- Returns a row only when it was created now.
INSERT INTO principal (tenant_id, principal_id, roles)
VALUES ($1, $2, '[]'::jsonb)
ON CONFLICT (tenant_id, principal_id) DO NOTHING
RETURNING principal_id;

-- name: lock_principal --
-- One principal as it stands, locked until the change to it commits (two operators changing
-- the same principal at once apply one after the other, each to what the other wrote).
SELECT principal_id, roles, revoked_at, updated_at
FROM principal
WHERE tenant_id = $1 AND principal_id = $2
FOR UPDATE;

-- name: change_principal --
-- The principal's new roles and whether it is revoked ($4); a revocation keeps its first time.
UPDATE principal
SET roles = $3::jsonb, updated_at = now(),
    revoked_at = CASE WHEN $4::boolean THEN coalesce(revoked_at, now()) END
WHERE tenant_id = $1 AND principal_id = $2
RETURNING principal_id, roles, revoked_at, updated_at;

-- name: list_principals --
-- The tenant's directory, or one principal of it ($2 NULL: all).
SELECT principal_id, roles, revoked_at, updated_at
FROM principal
WHERE tenant_id = $1 AND ($2::text IS NULL OR principal_id = $2)
ORDER BY principal_id;
