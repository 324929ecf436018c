-- Policy data and decisions (R2.6, R2.9) and budgets (R7): the principal directory the Cedar
-- policy reads at every evaluation, every policy decision with its policy version, and
-- per-workflow budgets reserved by one atomic statement.

-- ---------------------------------------------------------------- principal directory
-- Roles and revocation are data: revoking a principal is an UPDATE here, and the next
-- evaluation (admission, approval, the executor's re-check before dispatch) denies.
CREATE TABLE principal (
  tenant_id uuid NOT NULL,
  principal_id text NOT NULL CHECK (length(principal_id) BETWEEN 1 AND 200),
  roles jsonb NOT NULL DEFAULT '[]'
    CHECK (jsonb_typeof(roles) = 'array' AND jsonb_array_length(roles) <= 32),
  revoked_at timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, principal_id)
);

-- ---------------------------------------------------------------- policy decisions
-- Append-only: nobody is granted UPDATE or DELETE. `reasons` holds the @id of each Cedar
-- policy that determined the effect; `stage` says which question was asked when.
CREATE TABLE policy_decision (
  decision_id uuid PRIMARY KEY,
  tenant_id uuid NOT NULL,
  principal_id text NOT NULL,
  action text NOT NULL,
  resource_id text NOT NULL,
  effect text NOT NULL CHECK (effect IN ('allow', 'require_approval', 'deny')),
  policy_version text NOT NULL,
  reasons jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(reasons) = 'array'),
  reason text NOT NULL,
  stage text NOT NULL DEFAULT 'admission' CHECK (stage IN ('admission', 'approval', 'dispatch')),
  operation_id uuid,
  decided_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX policy_decision_by_operation ON policy_decision (tenant_id, operation_id, decided_at);

-- ---------------------------------------------------------------- budgets (R7)
-- One row per workflow and kind. The wall-clock budget is `deadline`, on every kind: past it,
-- nothing more is reserved. The CHECK is the last line of defence: whatever the code does,
-- remaining (limit - reserved - used) is never negative.
CREATE TABLE budget (
  tenant_id uuid NOT NULL,
  workflow_id text NOT NULL CHECK (length(workflow_id) BETWEEN 1 AND 200),
  kind text NOT NULL CHECK (kind IN ('model_tokens', 'tool_calls', 'concurrent_steps')),
  limit_amount bigint NOT NULL CHECK (limit_amount >= 0),
  reserved bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
  used bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
  deadline timestamptz,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, workflow_id, kind),
  CONSTRAINT budget_remaining_not_negative CHECK (reserved + used <= limit_amount)
);

-- One row per reservation; settled once (committed: the actual amount moved to `used`, the
-- rest returned; released: all returned). `operation_id` ties a tool call to its command so
-- the executor can settle after the authoritative terminal event.
CREATE TABLE budget_reservation (
  reservation_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id uuid NOT NULL,
  workflow_id text NOT NULL,
  kind text NOT NULL,
  amount bigint NOT NULL CHECK (amount > 0),
  used_amount bigint,
  state text NOT NULL DEFAULT 'reserved' CHECK (state IN ('reserved', 'committed', 'released')),
  operation_id uuid,
  created_at timestamptz NOT NULL DEFAULT now(),
  settled_at timestamptz,
  FOREIGN KEY (tenant_id, workflow_id, kind) REFERENCES budget (tenant_id, workflow_id, kind),
  CONSTRAINT budget_reservation_settled
    CHECK ((state = 'reserved') = (settled_at IS NULL) AND (state = 'reserved') = (used_amount IS NULL)),
  CONSTRAINT budget_reservation_used_within CHECK (used_amount BETWEEN 0 AND amount)
);
CREATE INDEX budget_reservation_by_operation ON budget_reservation (tenant_id, operation_id)
  WHERE operation_id IS NOT NULL;

-- ---------------------------------------------------------------- roles
-- agentledger_planner: the planner holds no database write privilege (R1.7, SPEC §0), yet it
-- must reserve model tokens before each model call (R7.2). It gets no table grant at all,
-- only EXECUTE on two SECURITY DEFINER functions that do exactly one thing each: reserve
-- (one atomic statement, refused past the limit or the deadline) and settle. It cannot read
-- a balance, raise a limit, open a budget or touch any other row.
--
-- agentledger_budget_keeper: owns those functions, so they run with its rights rather than
-- the migration owner's (often a superuser, which would bypass row security). It holds just
-- what the two functions need, NOLOGIN, and is itself subject to row security: the
-- functions check the tenant argument against the transaction's tenant AND the rows they
-- touch are filtered by the same tenant_isolation policies as every other role.
DO $$
DECLARE r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['agentledger_planner', 'agentledger_budget_keeper'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
      EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE', r);
    END IF;
  END LOOP;
END $$;

REVOKE ALL ON principal, policy_decision, budget, budget_reservation FROM PUBLIC;

-- Admission decides and records; the executor re-decides before each dispatch and records.
GRANT SELECT ON principal TO agentledger_admission, agentledger_executor, agentledger_auditor;
GRANT SELECT, INSERT ON policy_decision TO agentledger_admission, agentledger_executor;
GRANT SELECT ON policy_decision TO agentledger_auditor;

-- Admission opens a workflow's budgets (limits come from its trusted configuration); it and
-- the settling services read balances. Nobody but the keeper updates a balance.
GRANT SELECT, INSERT ON budget TO agentledger_admission;
GRANT SELECT ON budget TO agentledger_executor, agentledger_reconciler, agentledger_auditor;
GRANT SELECT ON budget_reservation
  TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor;
GRANT SELECT, UPDATE ON budget TO agentledger_budget_keeper;
GRANT SELECT, INSERT, UPDATE ON budget_reservation TO agentledger_budget_keeper;
GRANT INSERT ON event_outbox TO agentledger_budget_keeper;  -- the budget.exhausted audit

-- ---------------------------------------------------------------- row-level security
ALTER TABLE principal ENABLE ROW LEVEL SECURITY;
ALTER TABLE principal FORCE ROW LEVEL SECURITY;
ALTER TABLE policy_decision ENABLE ROW LEVEL SECURITY;
ALTER TABLE policy_decision FORCE ROW LEVEL SECURITY;
ALTER TABLE budget ENABLE ROW LEVEL SECURITY;
ALTER TABLE budget FORCE ROW LEVEL SECURITY;
ALTER TABLE budget_reservation ENABLE ROW LEVEL SECURITY;
ALTER TABLE budget_reservation FORCE ROW LEVEL SECURITY;

CREATE POLICY tenant_isolation ON principal
  TO agentledger_admission, agentledger_executor, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant());
CREATE POLICY tenant_isolation ON policy_decision
  TO agentledger_admission, agentledger_executor, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());
CREATE POLICY tenant_isolation ON budget
  TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor,
     agentledger_budget_keeper
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());
CREATE POLICY tenant_isolation ON budget_reservation
  TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor,
     agentledger_budget_keeper
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());
CREATE POLICY budget_audit ON event_outbox
  TO agentledger_budget_keeper
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());

-- ---------------------------------------------------------------- budget functions
-- search_path is pinned (pg_temp last) so a caller cannot shadow a table or function; the
-- tenant argument must equal the tenant bound to the caller's transaction.

-- Reserve `p_amount` of one kind. The decision is ONE statement: the UPDATE takes the row
-- lock and re-checks its WHERE against the latest committed balance (READ COMMITTED), so
-- concurrent reservations never see the same remaining balance; only a row it updated feeds
-- the reservation insert. A refusal is classified afterwards (that read decides nothing) and
-- audited as budget.exhausted in the caller's transaction.
CREATE FUNCTION agentledger_budget_reserve(
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

-- Settle a reservation once: p_used NULL releases it, otherwise commits p_used (<= amount)
-- and returns the rest. A concurrency slot is a lease, not consumption: committing one
-- returns it too. Settling again changes nothing and returns the recorded settlement
-- (settled_now = false); a concurrent settle waits on the row lock and then finds it settled.
CREATE FUNCTION agentledger_budget_settle(p_tenant uuid, p_reservation_id uuid, p_used bigint)
RETURNS TABLE (reservation_id uuid, workflow_id text, kind text, amount bigint,
               used_amount bigint, state text, operation_id uuid, settled_now boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
#variable_conflict use_column
BEGIN
  IF p_tenant IS NULL OR p_tenant IS DISTINCT FROM agentledger_current_tenant() THEN
    RAISE EXCEPTION 'budget tenant is not the transaction''s tenant'
      USING ERRCODE = 'insufficient_privilege';
  END IF;

  RETURN QUERY
  WITH settled AS (
    UPDATE budget_reservation AS r
    SET state = CASE WHEN p_used IS NULL THEN 'released' ELSE 'committed' END,
        used_amount = CASE WHEN p_used IS NULL OR r.kind = 'concurrent_steps' THEN 0
                           ELSE p_used END,
        settled_at = now()
    WHERE r.tenant_id = p_tenant AND r.reservation_id = p_reservation_id
      AND r.state = 'reserved'
    RETURNING r.tenant_id, r.reservation_id, r.workflow_id, r.kind, r.amount, r.used_amount,
              r.state, r.operation_id
  ), returned AS (
    UPDATE budget AS t
    SET reserved = t.reserved - s.amount, used = t.used + s.used_amount, updated_at = now()
    FROM settled AS s
    WHERE t.tenant_id = s.tenant_id AND t.workflow_id = s.workflow_id AND t.kind = s.kind
    RETURNING 1
  )
  SELECT s.reservation_id, s.workflow_id, s.kind, s.amount, s.used_amount, s.state,
         s.operation_id, true
  FROM settled AS s;
  IF FOUND THEN
    RETURN;
  END IF;

  RETURN QUERY
  SELECT r.reservation_id, r.workflow_id, r.kind, r.amount, r.used_amount, r.state,
         r.operation_id, false
  FROM budget_reservation AS r
  WHERE r.tenant_id = p_tenant AND r.reservation_id = p_reservation_id;
END $$;

ALTER FUNCTION agentledger_budget_reserve(uuid, text, text, bigint, uuid)
  OWNER TO agentledger_budget_keeper;
ALTER FUNCTION agentledger_budget_settle(uuid, uuid, bigint) OWNER TO agentledger_budget_keeper;
-- Functions are executable by PUBLIC by default; these only by the roles that schedule work.
REVOKE ALL ON FUNCTION agentledger_budget_reserve(uuid, text, text, bigint, uuid),
                       agentledger_budget_settle(uuid, uuid, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_budget_reserve(uuid, text, text, bigint, uuid),
                          agentledger_budget_settle(uuid, uuid, bigint)
  TO agentledger_planner, agentledger_admission, agentledger_executor, agentledger_reconciler;
