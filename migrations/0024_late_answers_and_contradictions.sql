-- What a provider says after the ledger moved on is kept, never dropped (issue 37 §3), and an
-- operator's resolution says whether a late call may still contradict it (§2).
--
-- A worker fenced out of its claim (a take-over, an operator's resolution) may still receive
-- the provider's answer to a call it sent before: a stalled process resuming, a slow
-- network. That answer is the provider's word about an attempt the ledger recorded; it goes
-- on that attempt (`late_answer`, `late_receipt`, `late_at`) whatever it says. A `Fenced`
-- answer closes the attempt as `fenced` (the provider refused the stale token: nothing
-- applied); any other closes it as `late`.

ALTER TABLE command_attempt
  ADD COLUMN late_answer text CHECK (late_answer IN (
    'applied', 'precondition_failed', 'refused', 'fenced', 'not_sent', 'in_doubt')),
  ADD COLUMN late_receipt text,
  ADD COLUMN late_at timestamptz,
  ADD CONSTRAINT command_attempt_late_complete CHECK ((late_answer IS NULL) = (late_at IS NULL)),
  ADD CONSTRAINT command_attempt_late_applied_has_receipt
    CHECK (late_answer IS DISTINCT FROM 'applied' OR late_receipt IS NOT NULL);

ALTER TABLE command_attempt DROP CONSTRAINT command_attempt_result_check;
ALTER TABLE command_attempt ADD CONSTRAINT command_attempt_result_check CHECK (result IN (
  'succeeded', 'denied', 'expired', 'unknown', 'review_required', 'failed', 'error', 'abandoned',
  'fenced', 'late'
));

-- A late `applied` that disagrees with the recorded outcome (resolved `failed`, refused,
-- expired, or another receipt) marks the command contradicted. A flag, not a state: the
-- state keeps saying what was recorded and every rule about states stays as it is (terminal
-- is terminal; a contradicted `failed` is never dispatched again); `explain`, the audit event
-- `command.contradicted`, the metric agentledger.contradictions and its alert say that the
-- provider later said otherwise, and the operator's way out is a compensating operation.
ALTER TABLE agent_command
  ADD COLUMN contradicted_at timestamptz,
  ADD COLUMN contradiction text,
  ADD CONSTRAINT agent_command_contradiction_complete
    CHECK ((contradicted_at IS NULL) = (contradiction IS NULL));
GRANT UPDATE (contradicted_at, contradiction) ON agent_command
  TO agentledger_executor, agentledger_reconciler;

-- The reconciler's sweep finds what a late answer left unsettled (its record and a
-- concurrent decision crossed): `unknown` commands with a late `applied` to settle, and
-- decided ones it contradicts, across tenants, keys only. Owned like the other cross-tenant
-- searches (0015): agentledger_sweeper reads commands and attempts through its policies.
CREATE INDEX command_attempt_late_applied ON command_attempt (tenant_id, operation_id)
  WHERE late_answer = 'applied';

CREATE FUNCTION agentledger_late_applied_v1(max_rows integer)
RETURNS TABLE (tenant_id uuid, operation_id uuid, state text, connector text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  -- From the attempts' partial index (late `applied` answers are rare), never a scan of
  -- every command.
  SELECT DISTINCT ON (c.updated_at, c.tenant_id, c.operation_id)
         c.tenant_id, c.operation_id, c.state, c.connector
  FROM public.command_attempt a
  JOIN public.agent_command c ON c.tenant_id = a.tenant_id AND c.operation_id = a.operation_id
  WHERE a.late_answer = 'applied'
    AND (c.state <> 'succeeded' OR a.late_receipt IS DISTINCT FROM c.provider_receipt)
    AND (c.state = 'unknown' OR (c.state NOT IN ('pending', 'dispatching')
                                 AND c.contradicted_at IS NULL))
  ORDER BY c.updated_at, c.tenant_id, c.operation_id
  LIMIT max_rows
$$;
ALTER FUNCTION agentledger_late_applied_v1(integer) OWNER TO agentledger_sweeper;
REVOKE ALL ON FUNCTION agentledger_late_applied_v1(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_late_applied_v1(integer) TO agentledger_reconciler;

-- An operator's resolution of a command whose late call may still land (a provider that
-- cannot be fenced, a fence that could not be advanced) is provisional: recorded, and shown
-- as such, with why.
ALTER TABLE command_resolution ADD COLUMN provisional boolean NOT NULL DEFAULT false;
