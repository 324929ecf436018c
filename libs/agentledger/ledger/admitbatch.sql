-- Admission's allowed path for a batch of commands of one tenant (issue 41 §2). Loaded once by
-- admitbatch.py; bound parameters only (arrays, one element per command, in batch order).

-- name: admit_allowed_batch --
-- `admit_allowed` (queries.sql) for every command of the batch in ONE statement: spend the
-- tool calls of each request's budget ($17 workflow per command, NULL: unbudgeted; $18 the
-- limit a budget opens with), admit the commands, their dispatch obligations, their
-- `command.admitted` audit events ($19) and their allow decisions ($20 reasons, $21 reason).
-- A request's budget is spent for all its new commands of the batch or for none (no room
-- for all of them: none is admitted here, each takes the exact per-row path), so the budget
-- stays exact. A command already recorded (a replay, a conflict) writes nothing here either.
-- Budgets are locked in workflow order, rows are written in batch order (the audit copy's
-- order). Returns one row per input, in batch order: created_at when admitted now (NULL:
-- nothing written for it, the caller's per-row path answers it) and whether its budget was
-- spent (a spend without an admission raced a concurrent first admission: given back).
WITH input AS (
  SELECT *
  FROM unnest($2::uuid[], $3::bytea[], $4::text[], $5::text[], $6::text[], $7::text[],
              $8::text[], $9::uuid[], $10::text[], $11::text[], $12::timestamptz[],
              $13::bytea[], $14::int[], $15::text[], $16::text[], $17::text[], $19::text[],
              $20::text[], $21::text[])
       WITH ORDINALITY AS i(operation_id, request_hash, principal_id, action, connector,
                            resource_id, expected_revision, decision_id, policy_version,
                            allowlist_version, expires_at, payload_ciphertext,
                            payload_key_version, traceparent, tracestate, workflow_id, audit,
                            reasons, reason, ord)
), fresh AS (
  SELECT i.* FROM input AS i
  WHERE NOT EXISTS (SELECT 1 FROM agent_command AS c
                    WHERE c.tenant_id = $1 AND c.operation_id = i.operation_id)
), wanted AS (
  SELECT workflow_id, count(*)::bigint AS n FROM fresh
  WHERE workflow_id IS NOT NULL GROUP BY workflow_id
), spent AS (
  INSERT INTO budget AS b (tenant_id, workflow_id, kind, limit_amount, used)
  SELECT $1, w.workflow_id, 'tool_calls', $18, w.n FROM wanted AS w
  WHERE $18::bigint >= w.n
  ORDER BY w.workflow_id
  ON CONFLICT (tenant_id, workflow_id, kind) DO UPDATE
  SET used = b.used + EXCLUDED.used, updated_at = now()
  WHERE b.limit_amount - b.reserved - b.used >= EXCLUDED.used
    AND (b.deadline IS NULL OR b.deadline > now())
  RETURNING b.workflow_id
), admitted AS (
  INSERT INTO agent_command (
    tenant_id, operation_id, request_hash, state, principal_id, action, connector,
    resource_id, expected_revision, decision_id, policy_version, allowlist_version,
    expires_at, payload_ciphertext, payload_key_version
  )
  SELECT $1, f.operation_id, f.request_hash, 'pending', f.principal_id, f.action, f.connector,
         f.resource_id, f.expected_revision, f.decision_id, f.policy_version,
         f.allowlist_version, f.expires_at, f.payload_ciphertext, f.payload_key_version
  FROM fresh AS f
  WHERE f.workflow_id IS NULL OR f.workflow_id IN (SELECT workflow_id FROM spent)
  ORDER BY f.ord
  ON CONFLICT (tenant_id, operation_id) DO NOTHING
  RETURNING operation_id, created_at
), done AS (
  SELECT f.*, a.created_at FROM fresh AS f JOIN admitted AS a USING (operation_id)
), spend_recorded AS (
  INSERT INTO budget_reservation (tenant_id, workflow_id, kind, amount, used_amount, state,
                                  operation_id, settled_at)
  SELECT $1, d.workflow_id, 'tool_calls', 1, 1, 'committed', d.operation_id, now()
  FROM done AS d WHERE d.workflow_id IS NOT NULL
  ORDER BY d.ord
), obligation AS (
  INSERT INTO command_outbox (
    tenant_id, operation_id, aggregatetype, aggregateid, type, payload, traceparent, tracestate
  )
  SELECT $1, d.operation_id, d.connector, $1::uuid::text || ':' || d.operation_id::text,
         'command.admitted',
         jsonb_build_object('tenant_id', $1::uuid, 'operation_id', d.operation_id,
                            'type', 'command.admitted'),
         d.traceparent, d.tracestate
  FROM done AS d
  ORDER BY d.ord
), audit AS (
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload,
                            traceparent, tracestate)
  SELECT $1::uuid, d.operation_id, 'audit', $1::uuid::text, 'command.admitted', d.audit::jsonb,
         d.traceparent, d.tracestate
  FROM done AS d
  ORDER BY d.ord
), decided AS (
  INSERT INTO policy_decision (decision_id, tenant_id, principal_id, action, resource_id,
                               effect, policy_version, reasons, reason, stage, operation_id)
  SELECT d.decision_id, $1, d.principal_id, d.action, d.resource_id, 'allow', d.policy_version,
         d.reasons::jsonb, d.reason, 'admission', d.operation_id
  FROM done AS d
  ORDER BY d.ord
  ON CONFLICT (decision_id) DO NOTHING
)
SELECT i.ord, d.created_at,
       i.workflow_id IS NOT NULL AND i.workflow_id IN (SELECT workflow_id FROM spent)
         AND i.operation_id IN (SELECT operation_id FROM fresh) AS spent
FROM input AS i LEFT JOIN done AS d USING (operation_id)
ORDER BY i.ord;

-- name: give_back_tool_calls --
-- The rare path of `admit_allowed_batch`: a request's spend raced a first admission of some
-- of its keys, which admitted nothing here; those tool calls go back (a replay spends nothing).
UPDATE budget SET used = used - $3, updated_at = now()
WHERE tenant_id = $1 AND workflow_id = $2 AND kind = 'tool_calls' AND used >= $3;
