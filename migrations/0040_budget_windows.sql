-- Budgets that bind principals and tenants over time, in money (issue 42, R16.3).
--
-- The operator declares budgets (agentledger.budgets.rules): a scope (run, principal,
-- tenant), a window (per call, calendar UTC hour, calendar UTC day) and a unit (calls,
-- tokens, or an amount in a currency read from a declared argument). Admission computes each
-- command's charges in memory (which budgets, which scope key, which window, how much) and
-- passes them to agentledger_budget_charge_v1 inside its one admitting statement (0025), so
-- a budget adds no round trip.
--
-- budget_window: one row per budget, scope key and window start — the running total
--   (reserved + used) that no two admissions see at the same value: the charge function
--   locks the rows it needs in one order and re-reads them under the lock.
-- budget_charge: one row per operation and budget, written once however often the proposal
--   is resubmitted (a partial unique index over the live rows). It is `reserved` at
--   admission, `settled` when the command succeeds, `released` when it ends without effect
--   (failed, denied, expired, review_required) or its approval request is denied, expires
--   or is superseded; an `unknown` command keeps its reservation (the money may be gone).
--   The release and the settlement are triggers, so no service adds a statement for them.
--
-- agentledger_budget_counter owns the functions: NOLOGIN, NOBYPASSRLS, and it sees budget
-- rows of every tenant only because the settle triggers run for whichever service ends a
-- command (the reconciler sweeps across tenants); the charge function itself refuses a
-- tenant other than the transaction's.

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentledger_budget_counter') THEN
    CREATE ROLE agentledger_budget_counter NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB
      NOCREATEROLE;
  END IF;
END $$;

CREATE TABLE budget_window (
  tenant_id    uuid        NOT NULL,
  budget       text        NOT NULL CHECK (length(budget) BETWEEN 1 AND 64),
  scope_key    text        NOT NULL CHECK (length(scope_key) BETWEEN 1 AND 200),
  window_start timestamptz NOT NULL,
  -- The limit the last charge was checked against (the operator may change it; each charge
  -- is checked against the configuration admission runs with).
  limit_amount bigint      NOT NULL CHECK (limit_amount >= 0),
  reserved     bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
  used         bigint      NOT NULL DEFAULT 0 CHECK (used >= 0),
  updated_at   timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, budget, scope_key, window_start)
);

CREATE TABLE budget_charge (
  charge_id    uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id    uuid        NOT NULL,
  operation_id uuid        NOT NULL,
  budget       text        NOT NULL CHECK (length(budget) BETWEEN 1 AND 64),
  scope        text        NOT NULL CHECK (scope IN ('run', 'principal', 'tenant')),
  scope_key    text        NOT NULL CHECK (length(scope_key) BETWEEN 1 AND 200),
  window_kind  text        NOT NULL CHECK (window_kind IN ('call', 'hour', 'day')),
  window_start timestamptz,  -- NULL for a per-call budget (no running total)
  unit         text        NOT NULL CHECK (unit IN ('calls', 'tokens', 'amount')),
  currency     text        CHECK (currency ~ '^[A-Z]{3}$'),
  amount       bigint      NOT NULL CHECK (amount > 0),
  limit_amount bigint      NOT NULL CHECK (limit_amount >= 0),
  state        text        NOT NULL DEFAULT 'reserved'
                           CHECK (state IN ('reserved', 'settled', 'released')),
  created_at   timestamptz NOT NULL DEFAULT now(),
  settled_at   timestamptz,
  CONSTRAINT budget_charge_settled CHECK ((state = 'reserved') = (settled_at IS NULL)),
  CONSTRAINT budget_charge_window CHECK ((window_kind = 'call') = (window_start IS NULL))
);
-- Counted once per operation and budget: a resubmission finds the live charge.
CREATE UNIQUE INDEX budget_charge_once ON budget_charge (tenant_id, operation_id, budget)
  WHERE state <> 'released';

ALTER TABLE budget_window ENABLE ROW LEVEL SECURITY;
ALTER TABLE budget_window FORCE ROW LEVEL SECURITY;
ALTER TABLE budget_charge ENABLE ROW LEVEL SECURITY;
ALTER TABLE budget_charge FORCE ROW LEVEL SECURITY;
REVOKE ALL ON budget_window, budget_charge FROM PUBLIC;

GRANT SELECT ON budget_window, budget_charge
  TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor;
CREATE POLICY tenant_isolation ON budget_window
  TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant());
CREATE POLICY tenant_isolation ON budget_charge
  TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant());

GRANT SELECT, INSERT, UPDATE ON budget_window TO agentledger_budget_counter;
GRANT SELECT, INSERT, UPDATE, DELETE ON budget_charge TO agentledger_budget_counter;
GRANT INSERT ON event_outbox TO agentledger_budget_counter;
CREATE POLICY budget_counter ON budget_window TO agentledger_budget_counter
  USING (true) WITH CHECK (true);
CREATE POLICY budget_counter ON budget_charge TO agentledger_budget_counter
  USING (true) WITH CHECK (true);
CREATE POLICY budget_counter_audit ON event_outbox FOR INSERT TO agentledger_budget_counter
  WITH CHECK (aggregatetype = 'audit' AND type = 'budget.exhausted'
              AND tenant_id = agentledger_current_tenant());

-- Charge one operation against every budget it falls under, all or nothing. p_charges is a
-- JSON array of {budget, scope, scope_key, window_kind, window_start, unit, currency,
-- amount, limit}. Returns NULL when charged (or already charged: a resubmission), else the
-- name of the first budget (by name) without room — audited as `budget.exhausted`, nothing
-- else written. Window rows are locked in (budget, scope_key, window_start) order, so two
-- admissions never deadlock on them and never see the same total.
CREATE FUNCTION agentledger_budget_charge_v1(p_tenant uuid, p_operation uuid, p_charges jsonb)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
DECLARE
  v_fresh jsonb;
  v_refused record;
BEGIN
  IF p_tenant IS NULL OR p_tenant IS DISTINCT FROM agentledger_current_tenant() THEN
    RAISE EXCEPTION 'budget tenant is not the transaction''s tenant'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  -- A per-call budget needs no running total: the amount alone is checked.
  SELECT c.budget, c.scope, c.scope_key, c.window_kind, c.window_start, c.unit, c.currency,
         c.amount, c."limit", 0::bigint AS spent
  INTO v_refused
  FROM jsonb_to_recordset(p_charges) AS c(budget text, scope text, scope_key text,
       window_kind text, window_start timestamptz, unit text, currency text, amount bigint,
       "limit" bigint)
  WHERE c.window_kind = 'call' AND c.amount > c."limit"
  ORDER BY c.budget LIMIT 1;
  IF NOT FOUND THEN
    -- The charges this operation does not hold yet (waits for a concurrent first admission
    -- of the same key, then skips what it charged).
    WITH fresh AS (
      INSERT INTO budget_charge (tenant_id, operation_id, budget, scope, scope_key,
                                 window_kind, window_start, unit, currency, amount,
                                 limit_amount)
      SELECT p_tenant, p_operation, c.budget, c.scope, c.scope_key, c.window_kind,
             c.window_start, c.unit, c.currency, c.amount, c."limit"
      FROM jsonb_to_recordset(p_charges) AS c(budget text, scope text, scope_key text,
           window_kind text, window_start timestamptz, unit text, currency text,
           amount bigint, "limit" bigint)
      ON CONFLICT (tenant_id, operation_id, budget) WHERE state <> 'released' DO NOTHING
      RETURNING budget, scope, scope_key, window_kind, window_start, unit, currency, amount,
                limit_amount
    )
    SELECT jsonb_agg(to_jsonb(fresh)) INTO v_fresh FROM fresh;
    IF v_fresh IS NULL THEN
      RETURN NULL;  -- counted already
    END IF;
    INSERT INTO budget_window (tenant_id, budget, scope_key, window_start, limit_amount)
    SELECT p_tenant, f.budget, f.scope_key, f.window_start, f.limit_amount
    FROM jsonb_to_recordset(v_fresh) AS f(budget text, scope_key text, window_start timestamptz,
         limit_amount bigint)
    WHERE f.window_start IS NOT NULL
    ORDER BY f.budget, f.scope_key, f.window_start
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM budget_window AS w
    WHERE w.tenant_id = p_tenant
      AND (w.budget, w.scope_key, w.window_start) IN (
        SELECT f.budget, f.scope_key, f.window_start
        FROM jsonb_to_recordset(v_fresh) AS f(budget text, scope_key text,
             window_start timestamptz))
    ORDER BY w.budget, w.scope_key, w.window_start
    FOR UPDATE;
    -- Under the locks, this statement's snapshot holds every committed charge.
    SELECT f.budget, f.scope, f.scope_key, f.window_kind, f.window_start, f.unit, f.currency,
           f.amount, f.limit_amount AS "limit", w.reserved + w.used AS spent
    INTO v_refused
    FROM jsonb_to_recordset(v_fresh) AS f(budget text, scope text, scope_key text,
         window_kind text, window_start timestamptz, unit text, currency text, amount bigint,
         limit_amount bigint)
    JOIN budget_window AS w ON w.tenant_id = p_tenant AND w.budget = f.budget
      AND w.scope_key = f.scope_key AND w.window_start = f.window_start
    WHERE w.reserved + w.used + f.amount > f.limit_amount
    ORDER BY f.budget LIMIT 1;
    IF NOT FOUND THEN
      UPDATE budget_window AS w
      SET reserved = w.reserved + f.amount, limit_amount = f.limit_amount, updated_at = now()
      FROM jsonb_to_recordset(v_fresh) AS f(budget text, scope_key text,
           window_start timestamptz, amount bigint, limit_amount bigint)
      WHERE w.tenant_id = p_tenant AND w.budget = f.budget AND w.scope_key = f.scope_key
        AND w.window_start = f.window_start;
      RETURN NULL;
    END IF;
    DELETE FROM budget_charge AS b
    WHERE b.tenant_id = p_tenant AND b.operation_id = p_operation AND b.state = 'reserved'
      AND b.budget IN (SELECT f.budget FROM jsonb_to_recordset(v_fresh) AS f(budget text));
  END IF;
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload)
  VALUES (p_tenant, p_operation, 'audit', p_tenant::text, 'budget.exhausted',
          jsonb_build_object('operation_id', p_operation, 'budget', v_refused.budget,
                             'scope', v_refused.scope, 'scope_key', v_refused.scope_key,
                             'window', v_refused.window_kind,
                             'window_start', v_refused.window_start,
                             'unit', v_refused.unit, 'currency', v_refused.currency,
                             'amount', v_refused.amount, 'limit', v_refused."limit",
                             'spent', v_refused.spent));
  RETURN v_refused.budget;
END $$;
ALTER FUNCTION agentledger_budget_charge_v1(uuid, uuid, jsonb) OWNER TO agentledger_budget_counter;
REVOKE ALL ON FUNCTION agentledger_budget_charge_v1(uuid, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_budget_charge_v1(uuid, uuid, jsonb)
  TO agentledger_admission;

-- Settle (`settled`) or give back (`released`) an operation's live charges: the amount
-- leaves `reserved` and, when settled, joins `used`. Runs once per operation: only charges
-- still `reserved` move.
CREATE FUNCTION agentledger_budget_settle_charges_v1(p_tenant uuid, p_operation uuid,
                                                      p_state text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
  WITH moved AS (
    UPDATE budget_charge AS b SET state = p_state, settled_at = now()
    WHERE b.tenant_id = p_tenant AND b.operation_id = p_operation AND b.state = 'reserved'
    RETURNING b.budget, b.scope_key, b.window_start, b.amount
  )
  UPDATE budget_window AS w
  SET reserved = w.reserved - m.amount,
      used = w.used + CASE WHEN p_state = 'settled' THEN m.amount ELSE 0 END,
      updated_at = now()
  FROM moved AS m
  WHERE w.tenant_id = p_tenant AND w.budget = m.budget AND w.scope_key = m.scope_key
    AND w.window_start = m.window_start;
END $$;
ALTER FUNCTION agentledger_budget_settle_charges_v1(uuid, uuid, text)
  OWNER TO agentledger_budget_counter;
REVOKE ALL ON FUNCTION agentledger_budget_settle_charges_v1(uuid, uuid, text) FROM PUBLIC;

CREATE FUNCTION agentledger_budget_on_command_end_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
  PERFORM agentledger_budget_settle_charges_v1(
    NEW.tenant_id, NEW.operation_id,
    CASE WHEN NEW.state = 'succeeded' THEN 'settled' ELSE 'released' END);
  RETURN NULL;
END $$;
ALTER FUNCTION agentledger_budget_on_command_end_v1() OWNER TO agentledger_budget_counter;
REVOKE ALL ON FUNCTION agentledger_budget_on_command_end_v1() FROM PUBLIC;

CREATE FUNCTION agentledger_budget_on_request_end_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
  PERFORM agentledger_budget_settle_charges_v1(NEW.tenant_id, NEW.operation_id, 'released');
  RETURN NULL;
END $$;
ALTER FUNCTION agentledger_budget_on_request_end_v1() OWNER TO agentledger_budget_counter;
REVOKE ALL ON FUNCTION agentledger_budget_on_request_end_v1() FROM PUBLIC;

-- Fires only on the step into an end state (a WHEN clause costs no call otherwise).
CREATE TRIGGER budget_charge_on_command_end AFTER UPDATE OF state ON agent_command
  FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state
        AND NEW.state IN ('succeeded', 'failed', 'denied', 'expired', 'review_required'))
  EXECUTE FUNCTION agentledger_budget_on_command_end_v1();
CREATE TRIGGER budget_charge_on_request_end AFTER UPDATE OF state ON approval_request
  FOR EACH ROW
  WHEN (OLD.state = 'pending' AND NEW.state IN ('denied', 'expired', 'superseded'))
  EXECUTE FUNCTION agentledger_budget_on_request_end_v1();
