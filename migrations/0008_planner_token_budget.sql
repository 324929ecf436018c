-- The planner reserves model tokens before each model call (SPEC R7.1-R7.3), yet it holds no
-- table privilege and must not choose its own limits. Operators set per-tenant defaults in
-- budget_default; the planner may only ask the database to open a workflow's budget FROM
-- those defaults (a SECURITY DEFINER function owned by agentledger_budget_keeper), then
-- reserve and settle through the functions of migration 0003.

CREATE TABLE budget_default (
  tenant_id uuid NOT NULL,
  kind text NOT NULL CHECK (kind IN ('model_tokens', 'tool_calls', 'concurrent_steps')),
  limit_amount bigint NOT NULL CHECK (limit_amount > 0),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, kind)
);
ALTER TABLE budget_default ENABLE ROW LEVEL SECURITY;
ALTER TABLE budget_default FORCE ROW LEVEL SECURITY;
REVOKE ALL ON budget_default FROM PUBLIC;
GRANT SELECT ON budget_default TO agentledger_budget_keeper, agentledger_auditor;
GRANT INSERT ON budget TO agentledger_budget_keeper;
CREATE POLICY tenant_isolation ON budget_default TO agentledger_budget_keeper, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant());

CREATE FUNCTION agentledger_budget_open_default(p_tenant uuid, p_workflow text, p_kind text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
AS $$
BEGIN
  IF p_tenant IS NULL OR p_tenant IS DISTINCT FROM agentledger_current_tenant() THEN
    RAISE EXCEPTION 'budget tenant is not the transaction''s tenant'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  INSERT INTO budget (tenant_id, workflow_id, kind, limit_amount)
  SELECT d.tenant_id, p_workflow, d.kind, d.limit_amount
  FROM budget_default AS d WHERE d.tenant_id = p_tenant AND d.kind = p_kind
  ON CONFLICT (tenant_id, workflow_id, kind) DO NOTHING;
  RETURN EXISTS (SELECT 1 FROM budget AS b
                 WHERE b.tenant_id = p_tenant AND b.workflow_id = p_workflow AND b.kind = p_kind);
END $$;
ALTER FUNCTION agentledger_budget_open_default(uuid, text, text)
  OWNER TO agentledger_budget_keeper;
REVOKE ALL ON FUNCTION agentledger_budget_open_default(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_budget_open_default(uuid, text, text)
  TO agentledger_planner, agentledger_admission;
