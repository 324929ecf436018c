-- Take-overs, attempts, requeues and resolutions of commands (SPEC R5, R6). Loaded by
-- dispatch.py; the executor's claim, pre-call mark and outcome are in steps.sql.

-- name: take_over --
-- R5.5: the reconciler takes over a command whose lease expired, or an `unknown` one it can
-- look up. The new token and generation fence the previous holder out of finalizing.
WITH target AS (
  SELECT tenant_id, operation_id, state AS previous_state FROM agent_command
  WHERE tenant_id = $1 AND operation_id = $2
    AND ((state = 'dispatching' AND lease_until < now()) OR state = 'unknown')
  FOR UPDATE SKIP LOCKED
)
UPDATE agent_command c
SET state = 'dispatching', claim_token = $3, claimed_by = $4,
    lease_until = now() + make_interval(secs => $5),
    fencing_generation = c.fencing_generation + 1, updated_at = now()
FROM target
WHERE c.tenant_id = target.tenant_id AND c.operation_id = target.operation_id
RETURNING c.fencing_generation, c.lease_until, target.previous_state;

-- name: close_unsent_attempts --
-- At a take-over ($3: the new generation): an earlier holder's attempt never marked as sent is
-- over — its claim can no longer pass the pre-call check — so it gets its end (R5.6), even if
-- that holder never reaches the ledger again (cut off, gave up at its transaction bound). One
-- that may have been sent stays open: only its call bound or a lookup says what it did.
UPDATE command_attempt
SET finished_at = now(), result = 'abandoned',
    detail = 'its claim was taken over after the lease expired; nothing was sent'
WHERE tenant_id = $1 AND operation_id = $2 AND fencing_generation < $3
  AND finished_at IS NULL AND sent_at IS NULL;

-- name: start_attempt --
-- R5.6: one row per execution attempt, written with the claim that authorises it.
INSERT INTO command_attempt (tenant_id, operation_id, fencing_generation, worker_id, kind,
                             traceparent)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING attempt_id, started_at;

-- name: finish_attempt --
-- The attempt's end and what came back.
UPDATE command_attempt SET finished_at = now(), result = $3, detail = $4
WHERE tenant_id = $1 AND attempt_id = $2;

-- name: attempts --
-- Every attempt of a command, oldest first, with what a provider answered it late (0024) and
-- the call bound its pre-call mark covered (0052).
SELECT attempt_id, fencing_generation, worker_id, kind, started_at, sent_at, finished_at, result,
       detail, traceparent, late_answer, late_receipt, late_at, call_bound_s
FROM command_attempt WHERE tenant_id = $1 AND operation_id = $2 ORDER BY started_at, attempt_id;

-- name: advance_generation --
-- An operator's resolution fences every earlier attempt out (issue 37): a new generation for
-- an `unknown` command nobody holds, which the connector then presents to the provider.
UPDATE agent_command SET fencing_generation = fencing_generation + 1
WHERE tenant_id = $1 AND operation_id = $2 AND state = 'unknown' AND claim_token IS NULL
RETURNING fencing_generation;

-- name: release --
-- Give a claimed command back to `pending`, conditional on the claim: only when it is proven
-- that nothing reached the provider, or that resending the same key is safe (R5.5). $5: seconds
-- to wait before the next dispatch (NULL: at once); the reconciler publishes it when due (0019).
UPDATE agent_command
SET state = 'pending', claim_token = NULL, lease_until = NULL, outcome_reason = $4,
    updated_at = now(), retry_at = now() + make_interval(secs => $5)
WHERE tenant_id = $1 AND operation_id = $2 AND claim_token = $3 AND state = 'dispatching'
RETURNING connector;

-- name: drop_obligation --
-- A published obligation may still await the relay's sweep; a requeue replaces it.
DELETE FROM command_outbox WHERE tenant_id = $1 AND operation_id = $2;

-- name: renew_obligation --
-- A new dispatch obligation, the relay publishes the insert again: `command.requeued` after
-- recovery proved resending safe, `command.republished` for a stranded command (0011).
INSERT INTO command_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload,
                            traceparent)
VALUES ($1, $2, $3, $1::uuid::text || ':' || $2::uuid::text, $5,
        jsonb_build_object('tenant_id', $1::uuid, 'operation_id', $2::uuid, 'type', $5::text),
        $4);

-- name: stranded_pending --
-- Keys of commands pending longer than $2 seconds with no obligation left in the outbox, or
-- whose requeue backoff ran out (`retry_at` set: 0019).
SELECT tenant_id, operation_id, connector, retry_at
FROM agentledger_stranded_pending_v2($1, make_interval(secs => $2));

-- name: touch_stranded --
-- Claims the renewal, conditional on the command still being stranded: of two reconcilers,
-- the second finds `updated_at` fresh (the row lock makes it re-read) and renews nothing.
UPDATE agent_command SET updated_at = now(), retry_at = NULL
WHERE tenant_id = $1 AND operation_id = $2 AND state = 'pending'
  AND CASE WHEN retry_at IS NOT NULL THEN retry_at <= now()
           ELSE updated_at < now() - make_interval(secs => $3) END
  AND NOT EXISTS (SELECT 1 FROM command_outbox o
                  WHERE o.tenant_id = $1 AND o.operation_id = $2)
RETURNING connector;

-- name: acting_attempts --
-- Attempts stamped as sent (they may have reached the provider), never closed, and sent less
-- than $3 seconds ago: their call may still be running.
SELECT attempt_id, worker_id, fencing_generation, sent_at
FROM command_attempt
WHERE tenant_id = $1 AND operation_id = $2 AND sent_at IS NOT NULL AND finished_at IS NULL
  AND sent_at > now() - make_interval(secs => $3)
ORDER BY sent_at;

-- name: end_leases_of --
-- A restarted worker ends the leases its predecessor (same identity) still holds (0017).
SELECT agentledger_end_leases_of_v2($1);

-- name: needs_reconciliation --
-- Keys of commands with an expired lease or an unknown outcome below the retry cap, across
-- tenants (the function returns no payload and no principal; see migrations 0004, 0012).
SELECT tenant_id, operation_id, state, connector
FROM agentledger_needs_reconciliation_v3($1, $2::text[], $3);

-- name: unknown_backlog --
-- Per connector, the commands in `unknown` now and the age in seconds of the oldest one's
-- doubt, across tenants (counts only; see migration 0023). For the reconciler's gauges.
SELECT connector, commands, oldest_age_s FROM agentledger_unknown_backlog_v1();

-- name: resolve_unknown --
-- An operator's resolution of an `unknown` command (R6.6): only from `unknown`.
UPDATE agent_command
SET state = $3, provider_receipt = $4, outcome_reason = $5, finished_at = now(),
    updated_at = now(), lease_until = NULL, claim_token = NULL
WHERE tenant_id = $1 AND operation_id = $2 AND state = 'unknown'
RETURNING fencing_generation;

-- name: record_resolution --
-- Who resolved it, when, why, with what evidence; $8: a late call may still land (0024).
INSERT INTO command_resolution (tenant_id, operation_id, resolved_by, outcome, receipt, reason,
                                evidence, provisional)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING resolution_id, resolved_at;

-- name: unknown_commands --
-- A tenant's commands awaiting an operator.
SELECT operation_id, action, connector, resource_id, principal_id, outcome_reason, updated_at
FROM agent_command WHERE tenant_id = $1 AND state = 'unknown' ORDER BY updated_at;

-- name: authorized_by --
-- How a command was authorized, for an honest expiry reason: its decision of stage
-- `approval` is a person's approval (principal_id: the approver); `admission` is the policy's
-- own allow, with no person involved.
SELECT stage, principal_id FROM policy_decision WHERE tenant_id = $1 AND decision_id = $2;
