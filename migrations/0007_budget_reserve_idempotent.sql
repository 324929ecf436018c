-- Budget reservations survive a crash between reserve and admit (found by the chaos suite):
-- admission reserves a tool call in its own transaction, then admits; a process killed in
-- between left the reservation open, and each redelivery of the same proposal reserved
-- again until the workflow's budget was spent by nothing. A reservation is now idempotent
-- per operation: an open one is found again instead of taken twice.

CREATE UNIQUE INDEX budget_reservation_one_open_per_operation
  ON budget_reservation (tenant_id, workflow_id, kind, operation_id)
  WHERE state = 'reserved' AND operation_id IS NOT NULL;

CREATE OR REPLACE FUNCTION agentledger_budget_reserve(
  p_tenant uuid, p_workflow text, p_kind text, p_amount bigint, p_operation_id uuid DEFAULT NULL
) RETURNS TABLE (reservation_id uuid, outcome text, limit_amount bigint, reserved bigint,
                 used bigint, deadline timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
DECLARE
  b record;
  v_outcome text;
BEGIN
  IF p_tenant IS NULL OR p_tenant IS DISTINCT FROM agentledger_current_tenant() THEN
    RAISE EXCEPTION 'budget tenant is not the transaction''s tenant'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF p_amount IS NULL OR p_amount <= 0 THEN
    RAISE EXCEPTION 'a reservation amount must be positive' USING ERRCODE = 'check_violation';
  END IF;

  -- Idempotent per operation: a redelivered proposal whose admission died after reserving
  -- (before its commit) finds its open reservation instead of taking a second one.
  IF p_operation_id IS NOT NULL THEN
    RETURN QUERY
    SELECT r.reservation_id, 'reserved'::text, t.limit_amount, t.reserved, t.used, t.deadline
    FROM budget_reservation AS r
    JOIN budget AS t ON t.tenant_id = r.tenant_id AND t.workflow_id = r.workflow_id
                    AND t.kind = r.kind
    WHERE r.tenant_id = p_tenant AND r.workflow_id = p_workflow AND r.kind = p_kind
      AND r.operation_id = p_operation_id AND r.state = 'reserved' AND r.amount = p_amount;
    IF FOUND THEN
      RETURN;
    END IF;
  END IF;

  RETURN QUERY
  WITH taken AS (
    UPDATE budget AS t
    SET reserved = t.reserved + p_amount, updated_at = now()
    WHERE t.tenant_id = p_tenant AND t.workflow_id = p_workflow AND t.kind = p_kind
      AND t.limit_amount - t.reserved - t.used >= p_amount
      AND (t.deadline IS NULL OR t.deadline > now())
    RETURNING t.tenant_id, t.workflow_id, t.kind, t.limit_amount, t.reserved, t.used, t.deadline
  ), held AS (
    INSERT INTO budget_reservation (tenant_id, workflow_id, kind, amount, operation_id)
    SELECT tenant_id, workflow_id, kind, p_amount, p_operation_id FROM taken
    RETURNING budget_reservation.reservation_id
  )
  SELECT held.reservation_id, 'reserved'::text, taken.limit_amount, taken.reserved, taken.used,
         taken.deadline
  FROM held CROSS JOIN taken;
  IF FOUND THEN
    RETURN;
  END IF;

  SELECT t.limit_amount, t.reserved, t.used, t.deadline INTO b
  FROM budget AS t
  WHERE t.tenant_id = p_tenant AND t.workflow_id = p_workflow AND t.kind = p_kind;
  v_outcome := CASE
    WHEN NOT FOUND THEN 'no_budget'
    WHEN b.deadline IS NOT NULL AND b.deadline <= now() THEN 'deadline_passed'
    ELSE 'exhausted'
  END;
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload)
  VALUES (p_tenant, p_operation_id, 'audit', p_tenant::text, 'budget.exhausted',
          jsonb_build_object('workflow_id', p_workflow, 'kind', p_kind, 'requested', p_amount,
                             'reason', v_outcome, 'limit', b.limit_amount,
                             'reserved', b.reserved, 'used', b.used, 'deadline', b.deadline,
                             'operation_id', p_operation_id));
  RETURN QUERY SELECT NULL::uuid, v_outcome, b.limit_amount::bigint, b.reserved::bigint,
                      b.used::bigint, b.deadline::timestamptz;
END $$;
