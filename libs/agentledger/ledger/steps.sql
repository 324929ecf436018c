-- The executor's three steps on the ledger — claim, pre-call mark, outcome — each one
-- set-based statement over the rows of one tenant (issue 41, lever 1b): the same locks,
-- checks, rows and events per command as one statement per command gave, one round trip
-- for all of them. Loaded by steps.py. Row i of every array is command i.

-- name: claim --
-- R5.1/R5.2: take PENDING commands ($2 operation ids, $3 fresh claim tokens, $8 traceparents,
-- $9 audit payloads less the generation) in one statement: row locks with SKIP LOCKED (in key
-- order: two overlapping batches never deadlock), the state checked atomically, a bounded
-- lease ($5 s), a fencing generation + 1. Only commands of a connector the worker holds ($6):
-- a record on the wrong topic must not leave a command claimed by a worker that cannot send
-- it (issue 17). In the same statement: each claim's attempt (R5.6; $7 its kind) and its
-- `command.claimed` audit event. Returns each claimed command as admission stored it and its
-- principal as the directory records it now (the dispatch-time policy check reads nothing
-- more); a command not claimed has no row (the caller loads it to say why).
WITH req AS (
  SELECT * FROM unnest($2::uuid[], $3::uuid[], $8::text[], $9::jsonb[])
    AS r (operation_id, token, traceparent, payload)
), target AS (
  SELECT c.tenant_id, c.operation_id FROM agent_command c
  WHERE c.tenant_id = $1 AND c.operation_id IN (SELECT operation_id FROM req)
    AND c.state = 'pending' AND c.connector = ANY($6::text[])
  ORDER BY c.operation_id
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE agent_command c
  SET state = 'dispatching', claim_token = req.token, claimed_by = $4,
      lease_until = now() + make_interval(secs => $5),
      fencing_generation = c.fencing_generation + 1,
      dispatched_at = coalesce(c.dispatched_at, now()), updated_at = now()
  FROM target JOIN req USING (operation_id)
  WHERE c.tenant_id = target.tenant_id AND c.operation_id = target.operation_id
  RETURNING c.tenant_id, c.operation_id, c.request_hash, c.state, c.principal_id, c.action,
            c.connector, c.resource_id, c.expected_revision, c.decision_id, c.policy_version,
            c.allowlist_version, c.expires_at, c.payload_ciphertext, c.payload_key_version,
            c.payload_purged_at, c.provider_receipt, c.outcome_reason, c.claim_token,
            c.claimed_by, c.fencing_generation, c.lease_until, c.created_at, c.updated_at,
            c.dispatched_at, c.finished_at, c.shadow, req.traceparent AS claim_traceparent,
            req.payload AS claim_payload
), attempt AS (
  INSERT INTO command_attempt (tenant_id, operation_id, fencing_generation, worker_id, kind,
                               traceparent)
  SELECT $1, operation_id, fencing_generation, $4, $7, claim_traceparent FROM claimed
  RETURNING operation_id, attempt_id
), audit AS (
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload,
                            traceparent)
  SELECT $1::uuid, operation_id, 'audit', $1::uuid::text, 'command.claimed',
         claim_payload || jsonb_build_object('fencing_generation', fencing_generation),
         claim_traceparent
  FROM claimed
)
SELECT claimed.*, attempt.attempt_id, p.principal_id IS NOT NULL AS principal_known,
       p.roles AS principal_roles,
       coalesce(p.revoked_at IS NOT NULL AND p.revoked_at <= now(), false) AS principal_revoked
FROM claimed JOIN attempt USING (operation_id)
LEFT JOIN principal p ON p.tenant_id = claimed.tenant_id AND p.principal_id = claimed.principal_id;

-- name: mark --
-- Right before calls reach their connectors ($2 operation ids, $3 claim tokens, $4 attempts,
-- $5 each call's bound plus a margin, in s): proves each claim is still its worker's with its
-- lease unexpired, makes the lease cover the whole call, and marks the attempt as one that
-- may have reached the connector (issue 17) with the bound it covered (0052: the reconciler's
-- "may still act" window); with each, its dispatch-time policy decision
-- ($6..$13; a NULL id: none). A lease that already covers the call is not rewritten (no
-- command version, no decoded change): while it runs past now + the bound no take-over can
-- begin (a take-over needs `lease_until < now()`), which is what the row lock of a renewal
-- guaranteed. One that does not is renewed under that lock: a take-over either committed
-- first (token or lease gone: no row, the worker must not call) or waits and then sees the
-- lease renewed past the end of the call. An attempt whose claim is gone and that never sent
-- is closed `abandoned` ($14). Returns the proven claims' leases.
WITH req AS (
  SELECT * FROM unnest($2::uuid[], $3::uuid[], $4::uuid[], $5::float8[], $6::uuid[],
                       $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
                       $12::jsonb[], $13::text[])
    AS r (operation_id, token, attempt_id, secs, decision_id, principal_id, action,
          resource_id, effect, policy_version, reasons, reason)
), covered AS (
  SELECT c.operation_id, c.lease_until FROM agent_command c JOIN req USING (operation_id)
  WHERE c.tenant_id = $1 AND c.claim_token = req.token AND c.state = 'dispatching'
    AND c.lease_until > now() + make_interval(secs => req.secs)
), renewed AS (
  UPDATE agent_command c
  SET lease_until = greatest(c.lease_until, now() + make_interval(secs => req.secs))
  FROM req
  WHERE c.tenant_id = $1 AND c.operation_id = req.operation_id AND c.claim_token = req.token
    AND c.state = 'dispatching' AND c.lease_until > now()
    AND req.operation_id NOT IN (SELECT operation_id FROM covered)
  RETURNING c.operation_id, c.lease_until
), proven AS (
  SELECT operation_id, lease_until FROM covered
  UNION ALL SELECT operation_id, lease_until FROM renewed
), stamped AS (
  UPDATE command_attempt a SET sent_at = coalesce(a.sent_at, now()),
                               call_bound_s = greatest(a.call_bound_s, req.secs)
  FROM proven JOIN req USING (operation_id)
  WHERE a.tenant_id = $1 AND a.attempt_id = req.attempt_id
  RETURNING req.operation_id, proven.lease_until
), abandoned AS (
  UPDATE command_attempt a SET finished_at = now(), result = 'abandoned', detail = $14
  FROM req
  WHERE a.tenant_id = $1 AND a.attempt_id = req.attempt_id
    AND req.operation_id NOT IN (SELECT operation_id FROM proven)
    AND a.sent_at IS NULL AND a.finished_at IS NULL
), decided AS (
  INSERT INTO policy_decision (decision_id, tenant_id, principal_id, action, resource_id,
                               effect, policy_version, reasons, reason, stage, operation_id)
  SELECT req.decision_id, $1, req.principal_id, req.action, req.resource_id, req.effect,
         req.policy_version, req.reasons, req.reason, 'dispatch', req.operation_id
  FROM stamped JOIN req USING (operation_id)
  WHERE req.decision_id IS NOT NULL
  ON CONFLICT (decision_id) DO NOTHING
)
SELECT operation_id, lease_until FROM stamped;

-- name: finalize --
-- R5.3: only the holder of the current claim token records an outcome ($2 operation ids,
-- $3 tokens, $4 states, $5 receipts, $6 reasons); lease and token are cleared. `pending`
-- (nothing was sent) and `unknown` are not terminal: no finished_at. In the same statement,
-- only for the claims that held: each attempt ($7) closed with its result and detail ($8,
-- $9), its audit event ($10 type, $11 payload) and, for terminal and unknown states, its
-- outcome event ($12, $13; NULL: none), with the trace ($14). Returns the rows that held.
WITH req AS (
  SELECT * FROM unnest($2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::text[],
                       $7::uuid[], $8::text[], $9::text[], $10::text[], $11::jsonb[],
                       $12::text[], $13::jsonb[], $14::text[])
    AS r (operation_id, token, state, receipt, reason, attempt_id, attempt_result, detail,
          audit_type, audit, outcome_type, outcome, traceparent)
), done AS (
  UPDATE agent_command c
  SET state = req.state, provider_receipt = req.receipt, outcome_reason = req.reason,
      lease_until = NULL, claim_token = NULL, updated_at = now(),
      finished_at = CASE WHEN req.state IN ('pending', 'unknown') THEN NULL ELSE now() END
  FROM req
  WHERE c.tenant_id = $1 AND c.operation_id = req.operation_id AND c.claim_token = req.token
    AND c.state = 'dispatching'
  RETURNING c.operation_id
), attempt AS (
  UPDATE command_attempt a SET finished_at = now(), result = req.attempt_result,
                               detail = req.detail
  FROM done JOIN req USING (operation_id)
  WHERE a.tenant_id = $1 AND a.attempt_id = req.attempt_id
), events AS (
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload,
                            traceparent)
  SELECT $1::uuid, req.operation_id, e.family, $1::uuid::text, e.type, e.payload,
         req.traceparent
  FROM done JOIN req USING (operation_id),
       LATERAL (VALUES ('audit', req.audit_type, req.audit),
                       ('outcome', req.outcome_type, req.outcome)) AS e (family, type, payload)
  WHERE e.payload IS NOT NULL
)
SELECT operation_id FROM done;
