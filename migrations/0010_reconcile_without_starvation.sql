-- The reconciler's search starved at scale (found by `make chaos N=200`): it returned the
-- oldest rows first, `unknown` ones included, and `unknown` commands of connectors without a
-- lookup (refunds) can only wait for an operator — once a batch's worth of them piled up, the
-- commands whose lease had expired behind them were never reached. Now the caller names the
-- connectors it can look up, and expired leases come first.

DROP FUNCTION agentledger_needs_reconciliation(integer);

CREATE FUNCTION agentledger_needs_reconciliation(max_rows integer, lookup_connectors text[])
RETURNS TABLE (tenant_id uuid, operation_id uuid, state text, connector text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  SELECT c.tenant_id, c.operation_id, c.state, c.connector
  FROM public.agent_command c
  WHERE (c.state = 'dispatching' AND c.lease_until < now())
     OR (c.state = 'unknown' AND c.connector = ANY(lookup_connectors))
  ORDER BY (c.state = 'unknown'), c.updated_at
  LIMIT max_rows
$$;
REVOKE ALL ON FUNCTION agentledger_needs_reconciliation(integer, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_needs_reconciliation(integer, text[])
  TO agentledger_reconciler;
