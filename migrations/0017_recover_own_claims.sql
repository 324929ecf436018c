-- A killed executor that restarts under the same identity waited out its predecessor's whole
-- lease (60 s) before the reconciler could recover the claims it abandoned (issue 18 §4).
-- At start-up, a worker with a stable identity (Kafka static membership: one live member per
-- id) ends the leases its predecessor still holds; the reconciler's next pass recovers them by
-- the connector's contract, fenced by a new generation. A predecessor that was only stalled
-- finds its claim gone at the pre-call check and does not call.

GRANT UPDATE (lease_until, updated_at) ON agent_command TO agentledger_sweeper;
CREATE POLICY sweeper_end_leases ON agent_command FOR UPDATE TO agentledger_sweeper
  USING (state = 'dispatching') WITH CHECK (state = 'dispatching');

CREATE FUNCTION agentledger_end_leases_of(worker text)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  WITH ended AS (
    UPDATE public.agent_command c
    SET lease_until = now() - interval '1 millisecond', updated_at = now()
    WHERE c.state = 'dispatching' AND c.claimed_by = worker AND c.lease_until > now()
    RETURNING 1
  )
  SELECT count(*)::integer FROM ended
$$;
ALTER FUNCTION agentledger_end_leases_of(text) OWNER TO agentledger_sweeper;
REVOKE ALL ON FUNCTION agentledger_end_leases_of(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_end_leases_of(text) TO agentledger_executor;
