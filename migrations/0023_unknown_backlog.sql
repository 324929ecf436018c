-- The `unknown` backlog for the alerts (issue 23: AgentledgerUnknownBacklog and
-- AgentledgerUnknownTooOld): per connector, how many commands are `unknown` now and how long
-- ago the oldest of them became `unknown`, across tenants. Only counts and an age leave the
-- function: no key, payload or principal. The reconciler calls it once per sweep and its
-- gauges report the result.
--
-- The age is measured from `updated_at`: the statement that records `unknown` (finalize, or
-- the executor's in-doubt outcome) sets it, and nothing writes it while the command stays
-- `unknown` — a take-over moves the command to `dispatching` and a resolution out of the
-- state. `finished_at` stays NULL for `unknown` (not terminal), and `dispatched_at` is the
-- first claim, which may be long before the doubt began.
--
-- Owned like the reconciler's other cross-tenant searches (0015): agentledger_sweeper reads
-- every tenant's commands through its policy and has no other right this body could use.
-- The count uses agent_command_dispatchable (a partial index on state that covers `unknown`).

CREATE FUNCTION agentledger_unknown_backlog_v1()
RETURNS TABLE (connector text, commands bigint, oldest_age_s double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  SELECT c.connector, count(*),
         greatest(extract(epoch FROM now() - min(c.updated_at)), 0)::double precision
  FROM public.agent_command c
  WHERE c.state = 'unknown'
  GROUP BY c.connector
$$;
ALTER FUNCTION agentledger_unknown_backlog_v1() OWNER TO agentledger_sweeper;
REVOKE ALL ON FUNCTION agentledger_unknown_backlog_v1() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_unknown_backlog_v1() TO agentledger_reconciler;
