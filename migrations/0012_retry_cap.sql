-- Every retry path is bounded (issue 17): a command whose sends never get a definitive
-- answer (a provider refusing its input with a 5xx, a lookup that never finds the effect)
-- was requeued forever — hundreds of provider calls and fencing generations in minutes.
-- Past a cap of fencing generations the ledger stops requeueing and holds the command as
-- `unknown` for an operator (the reason names the cap); the reconciler's search must then
-- leave it alone too, or its lookups would start the loop again. The caller passes the cap.

DROP FUNCTION agentledger_needs_reconciliation(integer, text[]);

CREATE FUNCTION agentledger_needs_reconciliation(max_rows integer, lookup_connectors text[],
                                                 max_generations integer)
RETURNS TABLE (tenant_id uuid, operation_id uuid, state text, connector text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  SELECT c.tenant_id, c.operation_id, c.state, c.connector
  FROM public.agent_command c
  WHERE (c.state = 'dispatching' AND c.lease_until < now())
     OR (c.state = 'unknown' AND c.connector = ANY(lookup_connectors)
         AND c.fencing_generation < max_generations)
  ORDER BY (c.state = 'unknown'), c.updated_at
  LIMIT max_rows
$$;
REVOKE ALL ON FUNCTION agentledger_needs_reconciliation(integer, text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_needs_reconciliation(integer, text[], integer)
  TO agentledger_reconciler;
