-- Every statement about budgets (R7). Reserve and settle go through the SECURITY DEFINER
-- functions of migration 0003, so the planner (which has no table grant) runs the same code
-- as admission. Loaded once by repository.py; bound parameters only.

-- name: open_budget --
-- One row per kind; opening again never changes a limit or deadline (first open wins).
INSERT INTO budget (tenant_id, workflow_id, kind, limit_amount, deadline)
SELECT $1, $2, kind, limit_amount, $5
FROM unnest($3::text[], $4::bigint[]) AS l(kind, limit_amount)
ON CONFLICT (tenant_id, workflow_id, kind) DO NOTHING;

-- name: open_default --
-- Open a workflow's budget of one kind from the tenant's operator-set default (planner).
SELECT agentledger_budget_open_default($1, $2, $3);

-- name: balances --
-- The workflow's balances, one row per kind.
SELECT kind, limit_amount, reserved, used, deadline
FROM budget
WHERE tenant_id = $1 AND workflow_id = $2
ORDER BY kind;

-- name: reserve --
-- One atomic reservation, or a classified (and audited) refusal.
SELECT reservation_id, outcome, limit_amount, reserved, used, deadline
FROM agentledger_budget_reserve_v2($1, $2, $3, $4, $5);

-- name: settle --
-- Commit ($3 = used) or release ($3 NULL) once; again returns the recorded settlement.
SELECT reservation_id, workflow_id, kind, amount, used_amount, state, operation_id
FROM agentledger_budget_settle($1, $2, $3);

-- name: reservations_for --
-- The reservations held for one operation (the executor settles them after the outcome).
SELECT reservation_id, workflow_id, kind, amount, used_amount, state, operation_id
FROM budget_reservation
WHERE tenant_id = $1 AND operation_id = $2
ORDER BY created_at, reservation_id;
