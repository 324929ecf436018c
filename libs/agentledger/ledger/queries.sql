-- Every statement of the command ledger. Loaded once by repository.py; bound parameters only.

-- name: bind_transaction --
-- The statement timeout ($1) and, unless $2 is NULL, the tenant for row-level security, for
-- the rest of this transaction only (a NULL tenant leaves the setting as it was: unbound).
SELECT set_config('statement_timeout', $1::text, true),
       CASE WHEN $2::text IS NOT NULL
            THEN set_config('agentledger.tenant_id', $2::text, true) END;

-- name: admit_command --
-- Seed §4: insert the command; only if THIS statement inserted it (RETURNING yields only
-- rows actually inserted) insert its dispatch obligation. Returns 1 if admitted now, else 0.
WITH admitted AS (
  INSERT INTO agent_command (
    tenant_id, operation_id, request_hash, state, principal_id, action, connector,
    resource_id, expected_revision, decision_id, policy_version, allowlist_version,
    expires_at, payload_ciphertext, payload_key_version
  ) VALUES ($1, $2, $3, 'pending', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
  ON CONFLICT (tenant_id, operation_id) DO NOTHING
  RETURNING tenant_id, operation_id, connector
), obligation AS (
  INSERT INTO command_outbox (
    tenant_id, operation_id, aggregatetype, aggregateid, type, payload, traceparent, tracestate
  )
  SELECT tenant_id, operation_id, connector,
         tenant_id::text || ':' || operation_id::text,
         'command.admitted',
         jsonb_build_object('tenant_id', tenant_id, 'operation_id', operation_id,
                            'type', 'command.admitted'),
         $15, $16
  FROM admitted
  RETURNING 1
)
SELECT count(*)::int FROM obligation;

-- name: admit_allowed --
-- Admission's allowed path in ONE statement (issue 41): spend the budget ($17 workflow, $18
-- its tool-call limit; NULL: unbudgeted), admit the command, its dispatch obligation, its
-- `command.admitted` audit event ($19) and the policy decision ($20 reasons, $21 reason) —
-- all or nothing, and only for the first admission: a command already recorded (a replay, a
-- conflict) or a budget with no room writes nothing here, and the caller takes the general
-- path (a read-back, the refusal's audit). A concurrent first admission of the same key can
-- pass `existing` and lose the insert: `spent` then says it spent, and the caller gives the
-- tool call back. The operator's budgets (issue 42; $22 the command's charges as JSON, NULL:
-- none) are charged by agentledger_budget_charge_v1 (0040) after the tool call, all or none:
-- a budget without room names itself in refused_by, writes its audit event and nothing else
-- (the caller gives the tool call back). Returns created_at when admitted (NULL otherwise),
-- spent, existed, refused_by.
WITH existing AS (
  SELECT 1 FROM agent_command WHERE tenant_id = $1 AND operation_id = $2
), spent AS (
  INSERT INTO budget AS b (tenant_id, workflow_id, kind, limit_amount, used)
  SELECT $1, $17, 'tool_calls', $18, 1
  WHERE $17::text IS NOT NULL AND $18::bigint >= 1 AND NOT EXISTS (SELECT 1 FROM existing)
  ON CONFLICT (tenant_id, workflow_id, kind) DO UPDATE
  SET used = b.used + 1, updated_at = now()
  WHERE b.limit_amount - b.reserved - b.used >= 1 AND (b.deadline IS NULL OR b.deadline > now())
  RETURNING b.workflow_id
), charged AS (
  SELECT agentledger_budget_charge_v1($1, $2, $22::jsonb) AS refused_by
  WHERE $22::jsonb IS NOT NULL AND NOT EXISTS (SELECT 1 FROM existing)
    AND ($17::text IS NULL OR EXISTS (SELECT 1 FROM spent))
), admitted AS (
  INSERT INTO agent_command (
    tenant_id, operation_id, request_hash, state, principal_id, action, connector,
    resource_id, expected_revision, decision_id, policy_version, allowlist_version,
    expires_at, payload_ciphertext, payload_key_version
  )
  SELECT $1, $2, $3, 'pending', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14
  WHERE NOT EXISTS (SELECT 1 FROM existing)
    AND ($17::text IS NULL OR EXISTS (SELECT 1 FROM spent))
    AND NOT EXISTS (SELECT 1 FROM charged WHERE refused_by IS NOT NULL)
  ON CONFLICT (tenant_id, operation_id) DO NOTHING
  RETURNING tenant_id, operation_id, connector, created_at
), spend_recorded AS (
  INSERT INTO budget_reservation (tenant_id, workflow_id, kind, amount, used_amount, state,
                                  operation_id, settled_at)
  SELECT $1, spent.workflow_id, 'tool_calls', 1, 1, 'committed', $2, now()
  FROM spent, admitted
), obligation AS (
  INSERT INTO command_outbox (
    tenant_id, operation_id, aggregatetype, aggregateid, type, payload, traceparent, tracestate
  )
  SELECT tenant_id, operation_id, connector, tenant_id::text || ':' || operation_id::text,
         'command.admitted',
         jsonb_build_object('tenant_id', tenant_id, 'operation_id', operation_id,
                            'type', 'command.admitted'),
         $15, $16
  FROM admitted
), audit AS (
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload,
                            traceparent, tracestate)
  SELECT $1::uuid, $2, 'audit', $1::uuid::text, 'command.admitted', $19::jsonb, $15, $16
  FROM admitted
), decided AS (
  INSERT INTO policy_decision (decision_id, tenant_id, principal_id, action, resource_id,
                               effect, policy_version, reasons, reason, stage, operation_id)
  SELECT $9, $1, $4, $5, $7, 'allow', $10, $20::jsonb, $21, 'admission', $2
  FROM admitted
  ON CONFLICT (decision_id) DO NOTHING
)
SELECT (SELECT created_at FROM admitted) AS created_at, EXISTS (SELECT 1 FROM spent) AS spent,
       EXISTS (SELECT 1 FROM existing) AS existed, (SELECT refused_by FROM charged) AS refused_by;

-- name: charge_budgets --
-- The general path's charge of the operator's budgets (the fast path folds it into
-- admit_allowed): NULL when charged (or charged before), else the budget without room.
SELECT agentledger_budget_charge_v1($1, $2, $3::jsonb);

-- name: give_back_tool_call --
-- The rare path of `admit_allowed`: its spend raced a first admission of the same key and
-- admitted nothing; the tool call goes back (a replay spends nothing).
UPDATE budget SET used = used - 1, updated_at = now()
WHERE tenant_id = $1 AND workflow_id = $2 AND kind = 'tool_calls' AND used >= 1;

-- name: recorded_command --
-- What the ledger holds for a key; in READ COMMITTED this statement takes a new snapshot, so
-- it sees a concurrent first admission once the uniqueness check has waited for it.
SELECT request_hash, state, provider_receipt, outcome_reason, action, connector, resource_id,
       created_at, finished_at, payload_purged_at IS NOT NULL AS payload_purged
FROM agent_command
WHERE tenant_id = $1 AND operation_id = $2;

-- name: load_command --
-- The frozen command as admission stored it, for the dispatcher (R1.6), with the shadow
-- flag (migration 0009) the dispatcher checks before any call (R9.2).
SELECT tenant_id, operation_id, request_hash, state, principal_id, action, connector,
       resource_id, expected_revision, decision_id, policy_version, allowlist_version,
       expires_at, payload_ciphertext, payload_key_version, payload_purged_at,
       provider_receipt, outcome_reason, claim_token, claimed_by, fencing_generation,
       lease_until, created_at, updated_at, dispatched_at, finished_at, shadow
FROM agent_command
WHERE tenant_id = $1 AND operation_id = $2;

-- name: append_event --
-- An audit or outcome event, published by the relay (audit.events.v1 / agent.outcomes.v1).
INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload,
                          traceparent, tracestate)
VALUES ($1::uuid, $2, $3, $1::uuid::text, $4, $5, $6, $7);

-- name: latest_data_key --
-- The tenant's current wrapped data key.
SELECT key_version, wrapped_key, master_key_id FROM tenant_data_key
WHERE tenant_id = $1 ORDER BY key_version DESC LIMIT 1;

-- name: data_key --
-- A given version of the tenant's wrapped data key (to decrypt older payloads).
SELECT key_version, wrapped_key, master_key_id FROM tenant_data_key
WHERE tenant_id = $1 AND key_version = $2;

-- name: insert_data_key --
-- First writer wins; a concurrent creator re-reads the winner's key.
INSERT INTO tenant_data_key (tenant_id, key_version, wrapped_key, master_key_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id, key_version) DO NOTHING;

-- name: xid_visible --
-- Whether the transaction with this 32-bit xid (the relay's `xid` header) is visible yet.
SELECT agentledger_xid_visible($1);

-- name: purge_approval_payloads --
-- Retention (R3.6) of approval requests decided longer ago than the window: both ciphertexts
-- go, and any excerpt a row written before 0016 kept in plaintext; the hash, the decision and
-- the evidence's refs and digests stay.
UPDATE approval_request a
SET payload_ciphertext = NULL, payload_key_version = NULL, evidence_ciphertext = NULL,
    evidence_key_version = NULL, payload_purged_at = now(),
    evidence = coalesce((SELECT jsonb_agg(e - 'excerpt') FROM jsonb_array_elements(a.evidence) e),
                        '[]'::jsonb)
WHERE a.approval_id IN (
  SELECT approval_id FROM approval_request
  WHERE state <> 'pending' AND payload_purged_at IS NULL
    AND decided_at < now() - make_interval(secs => $1)
  ORDER BY decided_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
RETURNING a.tenant_id, a.operation_id;

-- name: purge_payloads --
-- Retention (R3.6): drop payloads of commands terminal for longer than the window; the hash,
-- state and receipt stay, so a late replay is still recognised as replay or conflict.
UPDATE agent_command
SET payload_ciphertext = NULL, payload_key_version = NULL, payload_purged_at = now(),
    updated_at = now()
WHERE (tenant_id, operation_id) IN (
  SELECT tenant_id, operation_id FROM agent_command
  WHERE state IN ('succeeded', 'denied', 'expired', 'review_required', 'failed')
    AND payload_ciphertext IS NOT NULL
    AND finished_at < now() - make_interval(secs => $1)
  ORDER BY finished_at
  LIMIT $2
  FOR UPDATE SKIP LOCKED
)
RETURNING tenant_id, operation_id;

-- name: admitted_hash --
-- The request hash an operation id holds, if any: ingress' one question (0021).
SELECT agentledger_admitted_hash($1, $2);
