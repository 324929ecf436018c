-- Claiming, attempts and finalization of commands (SPEC R5, R6). Loaded by dispatch.py.

-- name: claim --
-- R5.1/R5.2: take a PENDING command in one short statement: row lock with SKIP LOCKED, the
-- state checked atomically, a bounded lease, a fresh claim token, fencing generation + 1.
-- Only a command of a connector the worker holds ($6): a record on the wrong topic must
-- not leave a command claimed by a worker that cannot send it (issue 17). In the same
-- statement (one round trip): the attempt row the claim authorises (R5.6; $7 its kind, $8
-- the trace) and its `command.claimed` audit event ($9: the payload, less the generation).
WITH target AS (
  SELECT tenant_id, operation_id FROM agent_command
  WHERE tenant_id = $1 AND operation_id = $2 AND state = 'pending'
    AND connector = ANY($6::text[])
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE agent_command c
  SET state = 'dispatching', claim_token = $3, claimed_by = $4,
      lease_until = now() + make_interval(secs => $5),
      fencing_generation = c.fencing_generation + 1,
      dispatched_at = coalesce(c.dispatched_at, now()), updated_at = now()
  FROM target
  WHERE c.tenant_id = target.tenant_id AND c.operation_id = target.operation_id
  RETURNING c.fencing_generation, c.lease_until
), attempt AS (
  INSERT INTO command_attempt (tenant_id, operation_id, fencing_generation, worker_id, kind,
                               traceparent)
  SELECT $1, $2, fencing_generation, $4, $7, $8 FROM claimed
  RETURNING attempt_id
), audit AS (
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload,
                            traceparent)
  SELECT $1::uuid, $2, 'audit', $1::uuid::text, 'command.claimed',
         $9::jsonb || jsonb_build_object('fencing_generation', fencing_generation), $8
  FROM claimed
)
SELECT claimed.fencing_generation, claimed.lease_until, attempt.attempt_id
FROM claimed, attempt;

-- name: claim_loaded --
-- The executor's claim in ONE statement (issue 41): `claim` (same lock, same checks, same
-- attempt and audit event), returning the command as admission stored it (what
-- `load_command` read before) and its principal as the directory records it now (what the
-- dispatch-time policy check read in a statement of its own). No row: nothing was claimed,
-- and the caller loads the command to say why.
WITH target AS (
  SELECT tenant_id, operation_id FROM agent_command
  WHERE tenant_id = $1 AND operation_id = $2 AND state = 'pending'
    AND connector = ANY($6::text[])
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE agent_command c
  SET state = 'dispatching', claim_token = $3, claimed_by = $4,
      lease_until = now() + make_interval(secs => $5),
      fencing_generation = c.fencing_generation + 1,
      dispatched_at = coalesce(c.dispatched_at, now()), updated_at = now()
  FROM target
  WHERE c.tenant_id = target.tenant_id AND c.operation_id = target.operation_id
  RETURNING c.tenant_id, c.operation_id, c.request_hash, c.state, c.principal_id, c.action,
            c.connector, c.resource_id, c.expected_revision, c.decision_id, c.policy_version,
            c.allowlist_version, c.expires_at, c.payload_ciphertext, c.payload_key_version,
            c.payload_purged_at, c.provider_receipt, c.outcome_reason, c.claim_token,
            c.claimed_by, c.fencing_generation, c.lease_until, c.created_at, c.updated_at,
            c.dispatched_at, c.finished_at, c.shadow
), attempt AS (
  INSERT INTO command_attempt (tenant_id, operation_id, fencing_generation, worker_id, kind,
                               traceparent)
  SELECT $1, $2, fencing_generation, $4, $7, $8 FROM claimed
  RETURNING attempt_id
), audit AS (
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload,
                            traceparent)
  SELECT $1::uuid, $2, 'audit', $1::uuid::text, 'command.claimed',
         $9::jsonb || jsonb_build_object('fencing_generation', fencing_generation), $8
  FROM claimed
)
SELECT claimed.*, attempt.attempt_id, p.principal_id IS NOT NULL AS principal_known,
       p.roles AS principal_roles,
       coalesce(p.revoked_at IS NOT NULL AND p.revoked_at <= now(), false) AS principal_revoked
FROM claimed CROSS JOIN attempt
LEFT JOIN principal p ON p.tenant_id = claimed.tenant_id AND p.principal_id = claimed.principal_id;

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

-- name: mark_sending --
-- Right before a call reaches the connector: proves the claim is still this worker's and its
-- lease unexpired, makes the lease cover the whole call ($5 s: the call bound plus a margin),
-- and marks the attempt as one that may have reached it (issue 17); and, in the same
-- statement, the dispatch-time policy decision ($6..$12; $6 NULL: none to record).
-- A lease that already covers the call is not rewritten (issue 41: no command version, no
-- decoded change): while it runs past now + $5 no take-over can begin (a take-over needs
-- `lease_until < now()`), which is what the row lock of a renewal guaranteed. A lease that
-- does not cover it is renewed under that lock: a take-over either committed first (the
-- token differs or the lease ran out: no row, the worker must not call) or waits and then
-- sees the lease renewed past the end of the call.
WITH covered AS (
  SELECT lease_until FROM agent_command
  WHERE tenant_id = $1 AND operation_id = $2 AND claim_token = $3 AND state = 'dispatching'
    AND lease_until > now() + make_interval(secs => $5)
), renewed AS (
  UPDATE agent_command
  SET lease_until = greatest(lease_until, now() + make_interval(secs => $5))
  WHERE tenant_id = $1 AND operation_id = $2 AND claim_token = $3 AND state = 'dispatching'
    AND lease_until > now() AND NOT EXISTS (SELECT 1 FROM covered)
  RETURNING lease_until
), proven AS (
  SELECT lease_until FROM covered UNION ALL SELECT lease_until FROM renewed
), stamped AS (
  UPDATE command_attempt SET sent_at = coalesce(sent_at, now())
  FROM proven
  WHERE tenant_id = $1 AND attempt_id = $4
  RETURNING proven.lease_until
), decided AS (
  INSERT INTO policy_decision (decision_id, tenant_id, principal_id, action, resource_id,
                               effect, policy_version, reasons, reason, stage, operation_id)
  SELECT $6, $1, $7, $8, $9, $10, $11, $12::jsonb, $13, 'dispatch', $2
  FROM stamped WHERE $6::uuid IS NOT NULL
  ON CONFLICT (decision_id) DO NOTHING
)
SELECT lease_until FROM stamped;

-- name: abandon_unsent --
-- A claim found gone at the pre-call check: its attempt ends `abandoned`, if it never sent.
UPDATE command_attempt SET finished_at = now(), result = 'abandoned', detail = $3
WHERE tenant_id = $1 AND attempt_id = $2 AND sent_at IS NULL AND finished_at IS NULL;

-- name: finish_attempt --
-- The attempt's end and what came back.
UPDATE command_attempt SET finished_at = now(), result = $3, detail = $4
WHERE tenant_id = $1 AND attempt_id = $2;

-- name: finalize --
-- R5.3: only the holder of the current claim token records an outcome; the lease and token
-- are cleared. `pending` (nothing was sent) and `unknown` are not terminal: no finished_at.
-- In the same statement (one round trip), only when the claim held: the attempt ($7) is
-- closed with its result and detail ($8, $9), the audit event is written ($10 type, $11
-- payload) and, for terminal and unknown states, the outcome event ($12, $13; NULL: none),
-- both with the trace ($14).
WITH done AS (
  UPDATE agent_command
  SET state = $4, provider_receipt = $5, outcome_reason = $6, lease_until = NULL,
      claim_token = NULL, updated_at = now(),
      finished_at = CASE WHEN $4 IN ('pending', 'unknown') THEN NULL ELSE now() END
  WHERE tenant_id = $1 AND operation_id = $2 AND claim_token = $3 AND state = 'dispatching'
  RETURNING fencing_generation
), attempt AS (
  UPDATE command_attempt SET finished_at = now(), result = $8, detail = $9
  WHERE tenant_id = $1 AND attempt_id = $7 AND EXISTS (SELECT 1 FROM done)
), events AS (
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload,
                            traceparent)
  SELECT $1::uuid, $2, e.family, $1::uuid::text, e.type, e.payload, $14
  FROM done, (VALUES ('audit', $10::text, $11::jsonb), ('outcome', $12::text, $13::jsonb))
    AS e (family, type, payload)
  WHERE e.payload IS NOT NULL
)
SELECT fencing_generation FROM done;

-- name: attempts --
-- Every attempt of a command, oldest first, with what a provider answered it late (0024).
SELECT attempt_id, fencing_generation, worker_id, kind, started_at, sent_at, finished_at, result,
       detail, traceparent, late_answer, late_receipt, late_at
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
