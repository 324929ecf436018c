-- A command admitted and never claimed, whose dispatch obligation is gone from the outbox,
-- is stranded: the relay swept its row as published, yet no executor ever took it. That
-- happens only if its Kafka record was lost after the broker acknowledged it (a phantom
-- acknowledgement, a deleted topic, an executor that committed an offset it never handled).
-- The reconciler finds such commands and renews their obligation; executors claim a
-- command once (`pending` -> `dispatching` is conditional), so a renewal never doubles an
-- effect. Keys only, across tenants, like agentledger_needs_reconciliation.

CREATE FUNCTION agentledger_stranded_pending(max_rows integer, older_than interval)
RETURNS TABLE (tenant_id uuid, operation_id uuid, connector text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  SELECT c.tenant_id, c.operation_id, c.connector
  FROM public.agent_command c
  WHERE c.state = 'pending' AND c.updated_at < now() - older_than
    AND NOT EXISTS (SELECT 1 FROM public.command_outbox o
                    WHERE o.tenant_id = c.tenant_id AND o.operation_id = c.operation_id)
  ORDER BY c.updated_at
  LIMIT max_rows
$$;
REVOKE ALL ON FUNCTION agentledger_stranded_pending(integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_stranded_pending(integer, interval)
  TO agentledger_reconciler;

-- The search's access path: pending commands by age.
CREATE INDEX agent_command_pending_age ON agent_command (updated_at) WHERE state = 'pending';
