-- The `unknown` backlog for the alerts (issue 23: AgentledgerUnknownBacklog and
-- AgentledgerUnknownTooOld): per connector, how many commands are `unknown` now and how long
-- ago the oldest of them was first sent, across tenants. Only counts and an age leave the
-- function: no key, payload or principal. The reconciler calls it once per sweep and its
-- gauges report the result.
--
-- The age is measured from the command's first claim (`dispatched_at`, its first send
-- follows at once): the alert on it exists because a lookup by idempotency key proves "not
-- done" only inside the provider's key retention, which runs from the first send. Not
-- `updated_at`: every take-over and requeue rewrites it, so it would restart the clock
-- while the retention window keeps running. An `unknown` command was always claimed; the
-- `updated_at` fallback only guards a row written by hand.
--
-- Owned like the reconciler's other cross-tenant searches (0015): agentledger_sweeper reads
-- every tenant's commands through its policy and has no other right this body could use.
-- The count uses agent_command_dispatchable (a partial index on state that covers `unknown`).

CREATE FUNCTION agentledger_unknown_backlog_v1()
RETURNS TABLE (connector text, commands bigint, oldest_age_s double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  SELECT c.connector, count(*),
         greatest(extract(epoch FROM now() - min(coalesce(c.dispatched_at, c.updated_at))), 0)
           ::double precision
  FROM public.agent_command c
  WHERE c.state = 'unknown'
  GROUP BY c.connector
$$;
ALTER FUNCTION agentledger_unknown_backlog_v1() OWNER TO agentledger_sweeper;
REVOKE ALL ON FUNCTION agentledger_unknown_backlog_v1() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_unknown_backlog_v1() TO agentledger_reconciler;
