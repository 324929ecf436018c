-- The reconciler waits while an attempt may still act (issue 18 §1): an attempt stamped as
-- sent and never closed, whose lease ended less than the connector's call bound ago, belongs
-- to a worker that may only be stalled. A worker restarted under the same identity knows its
-- predecessor is gone (static membership: one live member per id), so when it ends the
-- predecessor's leases at start-up (0017) it also closes their open attempts as `abandoned`:
-- nothing of that process can act any more, and recovery need not wait.

GRANT SELECT ON command_attempt TO agentledger_sweeper;
GRANT UPDATE (finished_at, result, detail) ON command_attempt TO agentledger_sweeper;
CREATE POLICY sweeper_read_attempts ON command_attempt FOR SELECT TO agentledger_sweeper
  USING (true);
CREATE POLICY sweeper_close_attempts ON command_attempt FOR UPDATE TO agentledger_sweeper
  USING (finished_at IS NULL) WITH CHECK (result = 'abandoned');

CREATE OR REPLACE FUNCTION agentledger_end_leases_of(worker text)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  WITH ended AS (
    UPDATE public.agent_command c
    SET lease_until = now() - interval '1 millisecond', updated_at = now()
    WHERE c.state = 'dispatching' AND c.claimed_by = worker AND c.lease_until > now()
    RETURNING c.tenant_id, c.operation_id
  ), closed AS (
    UPDATE public.command_attempt a
    SET finished_at = now(), result = 'abandoned',
        detail = 'its worker restarted under the same identity: the process that made this '
                 'attempt is gone'
    FROM ended e
    WHERE a.tenant_id = e.tenant_id AND a.operation_id = e.operation_id
      AND a.worker_id = worker AND a.finished_at IS NULL
    RETURNING 1
  )
  SELECT count(*)::integer FROM ended
$$;
