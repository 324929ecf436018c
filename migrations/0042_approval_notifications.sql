-- Notifications of pending approvals (issue 42 item 1): an outbox of their own.
-- Admission writes one row per request x recipient x channel x kind in the transaction that
-- creates the pending request, so a crash never loses one; the notifier service claims rows
-- with a lease (FOR UPDATE SKIP LOCKED; a killed worker's rows are taken over when the lease
-- passes), sends through the channel's plugin and marks them sent, or retries with backoff a
-- bounded number of times and then marks them failed (audited). The key is derived from
-- approval id + recipient + channel + kind (agentledger.notify.outbox.key), so a redelivery
-- carries the same key (webhook Idempotency-Key, e-mail Message-ID) and a receiver dedupes.

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentledger_notifier') THEN
    CREATE ROLE agentledger_notifier NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
  END IF;
END $$;

CREATE TABLE approval_notification (
  idempotency_key text        PRIMARY KEY CHECK (length(idempotency_key) BETWEEN 1 AND 200),
  tenant_id       uuid        NOT NULL,
  approval_id     uuid        NOT NULL REFERENCES approval_request (approval_id),
  kind            text        NOT NULL CHECK (kind IN ('requested', 'escalated', 'expired')),
  group_name      text        NOT NULL CHECK (length(group_name) BETWEEN 1 AND 64),
  recipient       text        NOT NULL CHECK (length(recipient) BETWEEN 1 AND 200),
  channel         text        NOT NULL CHECK (length(channel) BETWEEN 1 AND 64),
  address         text        NOT NULL CHECK (length(address) BETWEEN 1 AND 2000),
  message         jsonb       NOT NULL,
  -- cancelled: the request was decided (or superseded, or expired) before this request or
  -- escalation notice went out; nobody is asked to decide what is already closed.
  state           text        NOT NULL DEFAULT 'pending'
                              CHECK (state IN ('pending', 'sent', 'failed', 'cancelled')),
  attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  -- When the row may be claimed: now for a new row, the lease's end while a worker holds it,
  -- the backoff's end after a failed attempt.
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_owner     text        CHECK (length(lease_owner) BETWEEN 1 AND 200),
  last_error      text        CHECK (length(last_error) <= 500),
  created_at      timestamptz NOT NULL DEFAULT now(),
  sent_at         timestamptz
);

-- The notifier's claim: the due pending rows, oldest first.
CREATE INDEX approval_notification_due ON approval_notification (next_attempt_at)
  WHERE state = 'pending';
CREATE INDEX approval_notification_by_approval ON approval_notification (approval_id);

ALTER TABLE approval_notification ENABLE ROW LEVEL SECURITY;
ALTER TABLE approval_notification FORCE ROW LEVEL SECURITY;
REVOKE ALL ON approval_notification FROM PUBLIC;
GRANT SELECT, INSERT ON approval_notification TO agentledger_admission;
GRANT SELECT ON approval_notification TO agentledger_auditor;
CREATE POLICY tenant_isolation ON approval_notification
  TO agentledger_admission, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());

-- The notifier works across tenants, on this table only (and reads the requests it notifies
-- about); its audit events are approval notifications' own.
GRANT SELECT, INSERT, UPDATE ON approval_notification TO agentledger_notifier;
CREATE POLICY notifier_sends ON approval_notification TO agentledger_notifier
  USING (true) WITH CHECK (true);
GRANT SELECT ON approval_request TO agentledger_notifier;
CREATE POLICY notifier_reads ON approval_request FOR SELECT TO agentledger_notifier USING (true);
GRANT INSERT ON event_outbox TO agentledger_notifier;
CREATE POLICY notifier_audits ON event_outbox FOR INSERT TO agentledger_notifier
  WITH CHECK (aggregatetype = 'audit' AND type LIKE 'approval.%');
