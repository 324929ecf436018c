-- The ledger's shadow flag (migration 0009), read by the executor before any call (R9.2).

-- name: is_shadow --
-- Whether the command belongs to a shadow run; NULL (no row) reads as not found.
SELECT shadow FROM agent_command WHERE tenant_id = $1 AND operation_id = $2;
