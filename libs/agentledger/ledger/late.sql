-- What a provider said after the ledger moved on (issue 37 §3). Loaded by late.py.

-- name: command_for_late_answer --
-- The command as it stands, locked: a late answer and a concurrent decision (a finalize, a
-- resolution) are serialised on the row, so the one that comes second sees the other.
SELECT state, provider_receipt, claim_token, connector, fencing_generation, contradicted_at
FROM agent_command WHERE tenant_id = $1 AND operation_id = $2
FOR UPDATE;

-- name: record_late_answer --
-- The answer goes on the attempt that made the call ($2), whatever it says: $3 its kind, $4
-- the receipt (applied only), $5 the text. An attempt still open is closed: `fenced` when the
-- provider refused the stale token, `late` otherwise. One already closed keeps its result.
UPDATE command_attempt
SET late_answer = $3, late_receipt = $4, late_at = now(),
    finished_at = coalesce(finished_at, now()),
    result = coalesce(result, CASE WHEN $3 = 'fenced' THEN 'fenced' ELSE 'late' END),
    detail = coalesce(detail, $5)
WHERE tenant_id = $1 AND attempt_id = $2
RETURNING fencing_generation;

-- name: settle_by_late_answer --
-- An `unknown` command nobody holds, settled by a late `applied`: the provider's own answer to
-- an attempt of this command is the evidence a lookup would have given. Only from `unknown`.
UPDATE agent_command
SET state = 'succeeded', provider_receipt = $3, outcome_reason = $4, finished_at = now(),
    updated_at = now()
WHERE tenant_id = $1 AND operation_id = $2 AND state = 'unknown' AND claim_token IS NULL
RETURNING fencing_generation;

-- name: mark_contradicted --
-- The recorded outcome is contradicted by what the provider later said; the first mark stays.
UPDATE agent_command
SET contradicted_at = now(), contradiction = $3
WHERE tenant_id = $1 AND operation_id = $2 AND contradicted_at IS NULL
RETURNING contradicted_at;

-- name: late_applied --
-- Across tenants, keys only: `unknown` commands with a late `applied` to settle and decided
-- ones it contradicts, that their late answer's own record did not settle or mark (it and a
-- concurrent decision crossed). See migration 0024.
SELECT tenant_id, operation_id, state, connector FROM agentledger_late_applied_v1($1);

-- name: late_applied_of --
-- The late `applied` answers of one command, newest first.
SELECT attempt_id, fencing_generation, late_receipt, late_at
FROM command_attempt
WHERE tenant_id = $1 AND operation_id = $2 AND late_answer = 'applied'
ORDER BY late_at DESC;
