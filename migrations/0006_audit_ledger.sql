-- The durable audit ledger (SPEC R8.4): traces are not the audit. One row per transition,
-- written in the same transaction as the transition, by the same insert that publishes it:
-- every audit event written to the outbox is copied here by a trigger, with the same id the
-- relay puts in the Kafka record's `id` header — the table and audit.events.v1 carry the same
-- events, and nobody has a second way to write either.

CREATE TABLE audit_event (
  event_id uuid PRIMARY KEY,
  seq bigint GENERATED ALWAYS AS IDENTITY,   -- insertion order, for timelines
  tenant_id uuid NOT NULL,
  operation_id uuid,
  type text NOT NULL,
  payload jsonb NOT NULL,
  traceparent text,
  recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_event_by_operation ON audit_event (tenant_id, operation_id, seq);

CREATE FUNCTION agentledger_copy_audit_event() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
BEGIN
  INSERT INTO public.audit_event (event_id, tenant_id, operation_id, type, payload, traceparent,
                                  recorded_at)
  VALUES (NEW.id, NEW.tenant_id, NEW.operation_id, NEW.type, NEW.payload, NEW.traceparent,
          NEW.created_at);
  RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION agentledger_copy_audit_event() FROM PUBLIC;

CREATE TRIGGER audit_event_copy AFTER INSERT ON event_outbox
  FOR EACH ROW WHEN (NEW.aggregatetype = 'audit')
  EXECUTE FUNCTION agentledger_copy_audit_event();

-- Append-only, even for the owner: history is corrected by new events, never rewritten.
CREATE FUNCTION agentledger_audit_is_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'audit_event is append-only' USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON audit_event
  FOR EACH STATEMENT EXECUTE FUNCTION agentledger_audit_is_append_only();

ALTER TABLE audit_event ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_event FORCE ROW LEVEL SECURITY;
REVOKE ALL ON audit_event FROM PUBLIC;
-- Read per tenant by auditors and by `explain`; no role may INSERT, UPDATE or DELETE.
GRANT SELECT ON audit_event TO agentledger_auditor;
CREATE POLICY tenant_isolation ON audit_event TO agentledger_auditor
  USING (tenant_id = agentledger_current_tenant());

-- `explain` reads everything about one operation of one tenant.
GRANT SELECT ON policy_decision, approval_request, command_resolution TO agentledger_auditor;
