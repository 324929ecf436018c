-- SECURITY DEFINER functions run with their owner's rights. Those of 0004-0006 and 0010-0012
-- were owned by whoever ran the migrations — locally a superuser, which bypasses row security
-- and every grant (issue 17 §7). Like the budget functions (0003, agentledger_budget_keeper),
-- each now belongs to a NOLOGIN, NOBYPASSRLS role holding exactly what its body does, with
-- row-security policies saying which rows that is:
--
-- agentledger_sweeper: the reconciler's cross-tenant searches and the approval expiry. It
--   reads commands and obligations (keys only leave the functions), expires pending approval
--   requests, and writes their `approval.expired` audit events — nothing else.
-- agentledger_audit_writer: the trigger copying audit events from the outbox into the
--   append-only audit_event table; it can insert there and do nothing else.
-- tests/integration/test_ledger_rls.py checks that no SECURITY DEFINER function of the schema
-- is owned by a role that logs in, is a superuser or bypasses row security.

DO $$
DECLARE r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['agentledger_sweeper', 'agentledger_audit_writer'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
      EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE', r);
    END IF;
  END LOOP;
END $$;

GRANT SELECT ON agent_command, command_outbox TO agentledger_sweeper;
GRANT SELECT, UPDATE (state, decided_at, decided_by, decision_reason) ON approval_request
  TO agentledger_sweeper;
GRANT INSERT ON event_outbox TO agentledger_sweeper;
CREATE POLICY sweeper_search ON agent_command FOR SELECT TO agentledger_sweeper USING (true);
CREATE POLICY sweeper_search ON command_outbox FOR SELECT TO agentledger_sweeper USING (true);
CREATE POLICY sweeper_read ON approval_request FOR SELECT TO agentledger_sweeper USING (true);
CREATE POLICY sweeper_expire ON approval_request FOR UPDATE TO agentledger_sweeper
  USING (state = 'pending' AND expires_at <= now()) WITH CHECK (state = 'expired');
CREATE POLICY sweeper_audit ON event_outbox FOR INSERT TO agentledger_sweeper
  WITH CHECK (aggregatetype = 'audit' AND type = 'approval.expired');

ALTER FUNCTION agentledger_needs_reconciliation(integer, text[], integer)
  OWNER TO agentledger_sweeper;
ALTER FUNCTION agentledger_stranded_pending(integer, interval) OWNER TO agentledger_sweeper;
ALTER FUNCTION agentledger_expire_approvals(integer) OWNER TO agentledger_sweeper;

GRANT INSERT ON audit_event TO agentledger_audit_writer;
CREATE POLICY audit_copy ON audit_event FOR INSERT TO agentledger_audit_writer WITH CHECK (true);
ALTER FUNCTION agentledger_copy_audit_event() OWNER TO agentledger_audit_writer;
