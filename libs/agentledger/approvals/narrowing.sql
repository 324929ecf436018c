-- Narrow-only edits (issue 42). Loaded by narrowing.py; bound parameters only.

-- name: close_narrowed --
-- Close the original request `narrowed` (it never runs); its budget reservations are given
-- back by the trigger of 0046.
UPDATE approval_request
SET state = 'narrowed', decided_by = $3, decided_at = now(), decision_reason = $4,
    shown_hash = $5
WHERE tenant_id = $1 AND approval_id = $2 AND state = 'pending'
RETURNING *;

-- name: link_narrowed --
-- Point the new request at the one it narrowed.
UPDATE approval_request SET narrowed_from = $3
WHERE tenant_id = $1 AND approval_id = $2
RETURNING *;

-- name: reserved_charges --
-- The original's live budget reservations, as the charge function takes them.
SELECT budget, scope, scope_key, window_kind, window_start, unit, currency, amount,
       limit_amount
FROM budget_charge
WHERE tenant_id = $1 AND operation_id = $2 AND state = 'reserved'
ORDER BY budget;
