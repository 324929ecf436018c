-- Dispatch recovery and operator reconciliation (SPEC R5.5, R6.4, R6.6).

-- A requeue (nothing was sent, or a keyed lookup proved no effect) renews the dispatch
-- obligation: the executor and the reconciler replace the command's outbox row.
GRANT SELECT, INSERT, DELETE ON command_outbox TO agentledger_executor, agentledger_reconciler;
CREATE POLICY requeue ON command_outbox
  TO agentledger_executor, agentledger_reconciler
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());

-- Operators resolve `unknown` commands: who, when, why, with what evidence (R6.6).
CREATE TABLE command_resolution (
  resolution_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id uuid NOT NULL,
  operation_id uuid NOT NULL,
  resolved_by text NOT NULL,
  resolved_at timestamptz NOT NULL DEFAULT now(),
  outcome text NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
  receipt text,
  reason text NOT NULL,
  evidence text,
  CHECK (outcome <> 'succeeded' OR receipt IS NOT NULL),
  FOREIGN KEY (tenant_id, operation_id) REFERENCES agent_command (tenant_id, operation_id)
);
ALTER TABLE command_resolution ENABLE ROW LEVEL SECURITY;
ALTER TABLE command_resolution FORCE ROW LEVEL SECURITY;
REVOKE ALL ON command_resolution FROM PUBLIC;
GRANT SELECT, INSERT ON command_resolution TO agentledger_reconciler;
GRANT SELECT ON command_resolution TO agentledger_auditor;
CREATE POLICY tenant_isolation ON command_resolution
  TO agentledger_reconciler, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());

-- The reconciler works tenant by tenant under row security, but must first FIND the commands
-- that need it across tenants. This function returns only their keys and connector — no
-- payload, no principal — and runs with its owner's rights; its search_path is pinned.
CREATE FUNCTION agentledger_needs_reconciliation(max_rows integer)
RETURNS TABLE (tenant_id uuid, operation_id uuid, state text, connector text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  SELECT c.tenant_id, c.operation_id, c.state, c.connector
  FROM public.agent_command c
  WHERE (c.state = 'dispatching' AND c.lease_until < now())
     OR c.state = 'unknown'
  ORDER BY c.updated_at
  LIMIT max_rows
$$;
REVOKE ALL ON FUNCTION agentledger_needs_reconciliation(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_needs_reconciliation(integer) TO agentledger_reconciler;
