-- name: seed_admit --
-- The seed's admission statement: only the first insert of a (tenant, operation) creates
-- the dispatch obligation, because RETURNING yields only rows actually inserted.
WITH admitted AS (
  INSERT INTO agent_command (tenant_id, operation_id, request_hash, command, state)
  VALUES ($1, $2, $3, $4, 'pending')
  ON CONFLICT (tenant_id, operation_id) DO NOTHING
  RETURNING tenant_id, operation_id
)
INSERT INTO command_outbox (tenant_id, operation_id)
SELECT tenant_id, operation_id FROM admitted;

-- name: seed_recorded --
-- What the ledger holds for a key, compared by the caller with the submitted hash.
SELECT request_hash, state, provider_receipt
FROM agent_command
WHERE tenant_id = $1 AND operation_id = $2;
