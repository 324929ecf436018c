-- The cost of a command (issue 41): admission's allowed path in one statement, a budget
-- spent in one conditional upsert, audit events copied once per statement.
--
-- Budget fold. Admission used to open the budget, reserve one tool call through
-- agentledger_budget_reserve_v2 (a row version of the budget and a reservation row), admit,
-- and settle the reservation (two more versions). Spending at admission is one conditional
-- upsert instead — `used = used + 1 WHERE limit - reserved - used >= 1`, the row lock held to
-- the commit, so no two admissions see the same balance — and one reservation row written
-- already committed, so each operation's spend stays on record. A redelivered proposal
-- that raced its first admission (both saw no command; the second's insert did nothing)
-- gives its tool call back with one statement on that rare path.
GRANT UPDATE (used, updated_at) ON budget TO agentledger_admission;
GRANT INSERT ON budget_reservation TO agentledger_admission;

-- One audit copy per statement (REFERENCING NEW TABLE) instead of one plpgsql call per row:
-- every audit row of the outbox is still copied in the statement that wrote it, and the
-- copy's order is the rows' order in the statement.
CREATE FUNCTION agentledger_copy_audit_events_v2() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
BEGIN
  INSERT INTO public.audit_event (event_id, tenant_id, operation_id, type, payload, traceparent,
                                  recorded_at)
  SELECT n.id, n.tenant_id, n.operation_id, n.type, n.payload, n.traceparent, n.created_at
  FROM new_events AS n
  WHERE n.aggregatetype = 'audit';
  RETURN NULL;
END $$;
ALTER FUNCTION agentledger_copy_audit_events_v2() OWNER TO agentledger_audit_writer;
REVOKE ALL ON FUNCTION agentledger_copy_audit_events_v2() FROM PUBLIC;

DROP TRIGGER audit_event_copy ON event_outbox;
CREATE TRIGGER audit_event_copy_v2 AFTER INSERT ON event_outbox
  REFERENCING NEW TABLE AS new_events
  FOR EACH STATEMENT EXECUTE FUNCTION agentledger_copy_audit_events_v2();
DROP FUNCTION agentledger_copy_audit_event();
