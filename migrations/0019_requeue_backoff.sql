-- A command requeued because the provider could not be reached waited for nothing: its new
-- obligation was published at once, the next executor met the same outage within
-- milliseconds, and a 30 s CRM outage made 40 attempt rows out of 5 notes (issue 18 §4) —
-- then the retry cap turned them `unknown`. Such a requeue now waits: `retry_at` is when the
-- command may be dispatched again (exponential backoff with jitter, chosen by the executor),
-- and the reconciler publishes its obligation once it is due, like a stranded command's.

ALTER TABLE agent_command ADD COLUMN retry_at timestamptz;
GRANT UPDATE (retry_at) ON agent_command TO agentledger_executor, agentledger_reconciler;

-- Due for a (re)publication: pending, no obligation in the outbox, and either a backoff that
-- has run out or (no backoff) pending for longer than `older_than` (0011: a lost record).
DROP FUNCTION agentledger_stranded_pending(integer, interval);
CREATE FUNCTION agentledger_stranded_pending(max_rows integer, older_than interval)
RETURNS TABLE (tenant_id uuid, operation_id uuid, connector text, retry_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  SELECT c.tenant_id, c.operation_id, c.connector, c.retry_at
  FROM public.agent_command c
  WHERE c.state = 'pending'
    AND CASE WHEN c.retry_at IS NOT NULL THEN c.retry_at <= now()
             ELSE c.updated_at < now() - older_than END
    AND NOT EXISTS (SELECT 1 FROM public.command_outbox o
                    WHERE o.tenant_id = c.tenant_id AND o.operation_id = c.operation_id)
  ORDER BY coalesce(c.retry_at, c.updated_at)
  LIMIT max_rows
$$;
ALTER FUNCTION agentledger_stranded_pending(integer, interval) OWNER TO agentledger_sweeper;
REVOKE ALL ON FUNCTION agentledger_stranded_pending(integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_stranded_pending(integer, interval)
  TO agentledger_reconciler;
